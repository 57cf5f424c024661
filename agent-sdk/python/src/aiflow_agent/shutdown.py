"""The agent's shutdown, and the daemon's drain that stops short of it.

Shutdown always runs in this order, whatever started it (drain(), stop(), a signal, the daemon with
``on_daemon_drain="exit"``):
  1. stop taking work: the stream's credits are withdrawn, and items still on their way are given back;
  2. wait for in-flight items until the deadline; then abort what still runs (its context says
     ``drain-deadline``) and give those items back without spending an attempt;
  3. report every outcome (bounded by rpc_timeout when the daemon does not answer);
  4. say goodbye on the stream, stop heartbeats, deregister (the daemon marks the agent inactive at
     once), close the connections.
Heartbeats and lease renewals go on until step 4, so a long drain never looks like a dead agent.

A drain the daemon orders (by default, ``on_daemon_drain="pause"``) runs steps 1 to 3 and pauses:
the agent stays registered and heartbeating, and an undrain makes it take work again.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable, Optional

from .lifecycle import Lifecycle, is_terminal
from .link import Link
from .liveness import Liveness
from .options import AgentOptions
from .reporter import Reporter
from .stream import Channel
from .work import Work


class Shutdown:
    """The drain deadline and its timer, the daemon's drains (counted, so that a pause whose drain an
    undrain undid knows it), and the process's own shutdown, run once on a thread of its own."""

    def __init__(
        self,
        o: AgentOptions,
        log: logging.Logger,
        life: Lifecycle,
        link: Link,
        work: Work,
        channel: Channel,
        reporter: Reporter,
        liveness: Liveness,
        close: Callable[[], None],
    ) -> None:
        self._o = o
        self._log = log
        self._life = life
        self._link = link
        self._work = work
        self._channel = channel
        self._reporter = reporter
        self._liveness = liveness
        #: Step 4's last: closes the connections, the work and the signal handlers.
        self._close = close
        self._lock = threading.RLock()
        #: The process asked to stop (drain(), stop(), a signal): nothing the daemon says resumes it.
        self.leaving = False
        self._drain_epoch = 0
        self._deadline_at = math.inf
        self._deadline_timer: Optional[threading.Timer] = None
        self._shutdown: Optional[threading.Thread] = None

    def begin(self, deadline_at: float, why: str, wait: bool) -> None:
        """The process's own shutdown (the order above), once; a later call can only tighten its deadline."""
        with self._lock:
            self.leaving = True
            self.tighten(deadline_at)
            if self._shutdown is None:
                self._shutdown = threading.Thread(target=self._in_order, args=(why,), name="aiflow-agent-shutdown", daemon=True)
                self._shutdown.start()
        if wait and self._shutdown is not threading.current_thread():
            self._life.wait_for(is_terminal)

    def tighten(self, deadline_at: float) -> None:
        """Moves the drain deadline earlier (never later), re-arming its timer while a drain runs."""
        with self._lock:
            if deadline_at >= self._deadline_at:
                return
            self._deadline_at = deadline_at
            if self._life.state == "draining":
                self._arm_deadline()

    def _arm_deadline(self) -> None:
        with self._lock:
            if self._deadline_timer is not None:
                self._deadline_timer.cancel()
                self._deadline_timer = None
            if math.isinf(self._deadline_at):
                return
            t = threading.Timer(max(0.0, self._deadline_at - time.monotonic()), self._work.release_running)
            t.daemon = True
            t.start()
            self._deadline_timer = t

    def disarm(self) -> None:
        """Stops the deadline's timer."""
        with self._lock:
            if self._deadline_timer is not None:
                self._deadline_timer.cancel()
                self._deadline_timer = None

    def _start_draining(self, why: str) -> None:
        self._work.release_waiting()
        left = None if math.isinf(self._deadline_at) else max(0.0, self._deadline_at - time.monotonic())
        self._log.info("draining (%s): taking nothing more; %d in flight; deadline in %s", why, self._work.busy, "none" if left is None else f"{left:.1f}s")
        self._arm_deadline()

    def pause_for_daemon(self, deadline_at: float, why: str) -> None:
        """The daemon's drain, steps 1 to 3, then ``paused``; an undrain meanwhile (a newer drain
        epoch) or the process's own shutdown takes over from wherever this has got to."""
        with self._lock:
            self._drain_epoch += 1
            epoch = self._drain_epoch
            if not self._life.to("draining"):
                return

        def current() -> bool:
            return epoch == self._drain_epoch and not self.leaving and self._life.state == "draining"

        self.tighten(deadline_at)
        self._start_draining(why)
        self._channel.stop_taking(self._o.rpc_timeout)
        self._work.wait_idle(self._link.closed)
        if not current():
            return
        self.disarm()
        self._reporter.flush(self._o.rpc_timeout)
        with self._lock:
            if not current():
                return
            self._deadline_at = math.inf
            self._life.to("paused")

    def resume(self, source: str) -> None:
        """Undrained by the daemon: takes work again, unless the process is leaving."""
        with self._lock:
            if self.leaving:
                return
            self._drain_epoch += 1
            self.disarm()
            self._deadline_at = math.inf
            if not self._life.to("running"):
                return
        self._log.info("undrained (%s): taking work again", source)
        self._channel.start_taking()

    def _in_order(self, why: str) -> None:
        start = self._life.state
        if is_terminal(start):
            return
        if start == "initialized":
            self._life.to("stopped")
            return
        if start not in ("draining", "paused"):
            self._life.to("draining")
        if start == "starting":
            # Never registered: nothing to give back or report.
            self._link.close()
        self._start_draining(why)
        # 1. Stop taking work.
        self._channel.stop_taking(self._o.rpc_timeout)
        # 2. Wait for in-flight items; the deadline aborts and gives back what still runs.
        self._work.wait_idle(threading.Event())
        self.disarm()
        # 3. Report.
        if not self._reporter.flush(self._o.rpc_timeout):
            self._log.warning("stopping with %d outcomes unreported: the daemon did not answer", self._reporter.outstanding)
        self._reporter.close()
        if not self._life.to("drained"):
            return
        # 4. Goodbye, deregister, close.
        self._liveness.stop()
        self._channel.goodbye(self._o.rpc_timeout)
        if self._link.generation > 0:
            self._link.deregister(self._o.name)
        self._close()
        self._life.to("stopped")


__all__ = ["Shutdown"]
