"""The agent: registers (with the capacity it detects at start), heartbeats and renews its leases
from a thread of its own (liveness.py), takes work over the agent stream for its free slots
(stream.py), runs the handlers (work.py), reports outcomes (reporter.py), follows the daemon's
directives, and survives the daemon going away (link.py).

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
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from google.protobuf.duration_pb2 import Duration

from ._wire import AgentStatus, AgentStub, WireItem, pb
from .lifecycle import Lifecycle, is_terminal
from .link import Link, error_text
from .liveness import Liveness
from .options import AgentOptions, Capacity
from .reporter import Reporter
from .resources import Detected, Sampler, capacity_to_wire, detect_capacity, disk_mounts
from .stream import Channel
from .types import AgentFailedError, Outcome, Registration, WorkItem
from .work import Work, WorkHooks

STATUS = {AgentStatus.AGENT_STATUS_ACTIVE: "active", AgentStatus.AGENT_STATUS_DRAINING: "draining", AgentStatus.AGENT_STATUS_INACTIVE: "inactive"}
EVENTS = ("state", "registered", "disconnected", "item_started", "item_finished")


def _seconds(d: Duration, default: float) -> float:
    s: float = d.seconds + d.nanos / 1e9
    return s if s > 0 else default


class Agent:
    """A worker process's membership of the fleet. Make one with ``AgentOptions`` (or the same
    fields as keywords), then ``run()`` it (a worker's main) or ``start()`` and later ``drain()``."""

    def __init__(self, options: Optional[AgentOptions] = None, **fields: Any) -> None:
        o = options if options is not None else AgentOptions(**fields)
        o.check()
        self._o = o
        self.name = o.name
        self._log = o.logger or logging.getLogger(f"aiflow_agent.{o.name}")
        self._life = Lifecycle()
        self._listeners: Dict[str, List[Callable[..., None]]] = {e: [] for e in EVENTS}
        self._life.on_change(self._state_changed)
        self._lock = threading.RLock()
        self._registration: Optional[Registration] = None
        self._capacity: Optional[Detected] = None
        self._error: Optional[AgentFailedError] = None
        self._leaving = False
        self._drain_epoch = 0
        self._deadline_at = math.inf
        self._deadline_timer: Optional[threading.Timer] = None
        self._shutdown: Optional[threading.Thread] = None
        self._signals: Dict[int, Any] = {}
        self._link = Link(o, self._log, self._register, lambda e: self._emit("disconnected", e), self._fail)
        self._work = Work(o, self._log, self._work_hooks())
        self._channel = Channel(self._link, o, self._log, self)
        self._reporter = Reporter(self._channel, self._work.answered, self._work.unanswered)
        self._work.reporter = self._reporter
        self._liveness = Liveness(
            self._link, o, self._log, lambda: self._work.busy, self._work.held, self._heartbeat_reply,
            lambda: self._reregister("the daemon does not know this agent"), self._work.lease_lost,
        )

    # ── What a worker sees ──────────────────────────────────────────────────────────────────────

    @property
    def state(self) -> str:
        return self._life.state

    @property
    def error(self) -> Optional[AgentFailedError]:
        """Why the agent failed (state ``failed``)."""
        return self._error

    @property
    def registration(self) -> Optional[Registration]:
        return self._registration

    @property
    def capacity(self) -> Optional[Detected]:
        """What the agent registered as its resources, once start() detected it."""
        return self._capacity

    @property
    def in_flight(self) -> int:
        return self._work.busy

    def on(self, event: str, fn: Callable[..., None]) -> None:
        """Listens to ``state`` (state, previous), ``registered`` (Registration), ``disconnected``
        (error), ``item_started`` (WorkItem), ``item_finished`` (WorkItem, Outcome). Listeners run on
        the agent's threads and must not block."""
        if event not in self._listeners:
            raise ValueError(f"unknown event {event!r}: one of {', '.join(EVENTS)}")
        self._listeners[event].append(fn)

    def start(self) -> None:
        """Registers and starts working; returns once running (or stopped, when drain() or stop()
        came first). An unreachable daemon is retried with backoff meanwhile; a refusal raises
        AgentFailedError."""
        if not self._life.to("starting"):
            raise RuntimeError(f"agent '{self.name}' cannot start: it is {self.state}")
        if self._o.handle_signals:
            self._install_signals()
        given = self._o.capacity
        if given is not False:
            self._capacity = detect_capacity(given if isinstance(given, Capacity) else Capacity(), self._o.mounts, self._log)
            self._log.info("capacity to register: %s", self._capacity)
        mounts = [d.mount for d in self._capacity.disks] if self._capacity else disk_mounts(self._o.mounts)
        sampler = Sampler(mounts, bool(self._capacity and self._capacity.gpus), self._o.heartbeat_metrics, self._log)
        self._link.connect()
        if self._error is not None:
            raise self._error
        if self.state != "starting":
            return
        reg = self._registration
        assert reg is not None
        self._liveness.start(sampler, reg.heartbeat_interval, reg.lease_ttl)
        self._channel.open()
        self._life.to("running")
        self._channel.start_taking()
        if reg.status == "draining":
            self._on_daemon_status("draining", None, "registration")

    def run(self) -> None:
        """Starts, and returns when the agent has stopped (raises when it failed): a worker's main."""
        self.start()
        self.wait()
        self._restore_signals()
        if self._error is not None:
            raise self._error

    def wait(self, timeout: Optional[float] = None) -> str:
        """Waits (up to ``timeout`` seconds) until the agent stopped or failed; returns the state."""
        self._life.wait_for(is_terminal, timeout)
        return self.state

    def drain(self, deadline: Optional[float] = None, wait: bool = True) -> None:
        """Shuts down gracefully (see the order above); ``deadline`` is seconds from now
        (default ``graceful_shutdown``). With ``wait``, returns once stopped."""
        at = time.monotonic() + (self._o.graceful_shutdown if deadline is None else deadline)
        self._begin_shutdown(at, "drain requested", wait)

    def stop(self, wait: bool = True) -> None:
        """Shuts down now: in-flight items are aborted and given back, then the agent deregisters."""
        self._begin_shutdown(time.monotonic(), "stop requested", wait)

    # ── Registration ────────────────────────────────────────────────────────────────────────────

    def _register(self, stub: AgentStub, address: str) -> None:
        o = self._o
        meta = pb.AgentMetadata(tags=dict(o.tags), slots=o.slots, tenants=list(o.tenants), engine_kinds=o.resolved_engine_kinds(), models=list(o.models))
        if self._capacity is not None:
            meta.capacity.CopyFrom(capacity_to_wire(self._capacity))
        req = pb.RegisterRequest(
            name=o.name, agent_version=o.agent_version, binary_path=o.binary_path or (sys.argv[0] if sys.argv else ""),
            agent_type=pb.AGENT_TYPE_LOCAL if o.agent_type == "local" else pb.AGENT_TYPE_REMOTE, metadata=meta,
        )
        res = stub.Register(req, timeout=o.rpc_timeout, metadata=self._link.metadata)
        reg = Registration(
            id=res.id, address=address, created=res.created,
            heartbeat_interval=_seconds(res.heartbeat_interval, 5.0), lease_ttl=_seconds(res.lease_ttl, 30.0),
            status=STATUS.get(res.status, "active"),
        )
        again = self._registration is not None
        self._registration = reg
        self._log.info("%s with %s as %s (status %s)", "registered again" if again else "registered", address, reg.id, reg.status)
        if again:
            self._liveness.retime(reg.heartbeat_interval, reg.lease_ttl)
        self._emit("registered", reg)
        if again and reg.status in ("draining", "active"):
            self._on_daemon_status(reg.status, None, "registration")

    def _reregister(self, why: str) -> None:
        if self.state not in ("running", "paused"):
            return
        generation = self._link.generation
        threading.Thread(target=self._recover, args=(generation, RuntimeError(why)), name="aiflow-agent-reregister", daemon=True).start()

    def _recover(self, generation: int, cause: BaseException) -> None:
        try:
            self._link.recover(generation, cause)
        except AgentFailedError:
            pass

    # ── The stream's hooks (channel.ChannelHooks) ───────────────────────────────────────────────

    def room(self) -> int:
        return self._work.room() if self.state == "running" else 0

    def on_items(self, items: List[WireItem]) -> None:
        self._work.accept(items, taking=self.state == "running")

    def on_status(self, status: int) -> None:
        self._on_daemon_status(STATUS.get(status, "active"), None, "stream")

    def on_directive(self, d: pb.Directive) -> None:
        kind = d.WhichOneof("kind")
        if kind == "cancel":
            self._work.cancel(d.cancel.work_item_id, d.cancel.lease_token, d.cancel.reason or "cancelled")
        elif kind == "status":
            s = d.status
            deadline = None
            if s.HasField("drain_deadline"):
                wall = s.drain_deadline.seconds + s.drain_deadline.nanos / 1e9
                deadline = time.monotonic() + max(0.0, wall - time.time())
            self._on_daemon_status(STATUS.get(s.status, "active"), deadline, s.reason or "directive")

    def on_ready(self) -> None:
        self._reporter.pump()

    def _heartbeat_reply(self, reply: pb.HeartbeatResponse) -> None:
        for d in reply.directives:
            if d.WhichOneof("kind") == "cancel":
                self.on_directive(d)
        # While the stream is open it is the word on status; a heartbeat reply may be older.
        if self._channel.ready:
            return
        for d in reply.directives:
            if d.WhichOneof("kind") == "status":
                self.on_directive(d)
                return
        self._on_daemon_status(STATUS.get(reply.status, "active"), None, "heartbeat reply")

    def _on_daemon_status(self, status: str, deadline_at: Optional[float], source: str) -> None:
        state = self.state
        why = f"the daemon is draining this agent ({source})"
        if status == "draining":
            if state == "running":
                at = deadline_at if deadline_at is not None else math.inf
                if self._o.on_daemon_drain == "exit":
                    self._begin_shutdown(at, why, False)
                else:
                    threading.Thread(target=self._pause_for_daemon, args=(at, why), name="aiflow-agent-drain", daemon=True).start()
            elif state == "draining" and deadline_at is not None:
                self._tighten(deadline_at)
        elif status == "active" and (state == "paused" or (state == "draining" and not self._leaving)):
            self._resume(source)
        elif status == "inactive" and state in ("running", "paused"):
            self._reregister(f"the daemon marked this agent inactive ({source})")

    # ── Draining and shutdown ───────────────────────────────────────────────────────────────────

    def _begin_shutdown(self, deadline_at: float, why: str, wait: bool) -> None:
        with self._lock:
            self._leaving = True
            self._tighten(deadline_at)
            if self._shutdown is None:
                self._shutdown = threading.Thread(target=self._shutdown_in_order, args=(why,), name="aiflow-agent-shutdown", daemon=True)
                self._shutdown.start()
        if wait and self._shutdown is not threading.current_thread():
            self.wait()

    def _tighten(self, deadline_at: float) -> None:
        """Moves the drain deadline earlier (never later), re-arming its timer while a drain runs."""
        with self._lock:
            if deadline_at >= self._deadline_at:
                return
            self._deadline_at = deadline_at
            if self.state == "draining":
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

    def _disarm_deadline(self) -> None:
        with self._lock:
            if self._deadline_timer is not None:
                self._deadline_timer.cancel()
                self._deadline_timer = None

    def _start_draining(self, why: str) -> None:
        self._work.release_waiting()
        left = None if math.isinf(self._deadline_at) else max(0.0, self._deadline_at - time.monotonic())
        self._log.info("draining (%s): taking nothing more; %d in flight; deadline in %s", why, self._work.busy, "none" if left is None else f"{left:.1f}s")
        self._arm_deadline()

    def _pause_for_daemon(self, deadline_at: float, why: str) -> None:
        with self._lock:
            self._drain_epoch += 1
            epoch = self._drain_epoch
            if not self._life.to("draining"):
                return

        def current() -> bool:
            return epoch == self._drain_epoch and not self._leaving and self.state == "draining"

        self._tighten(deadline_at)
        self._start_draining(why)
        self._channel.stop_taking(self._o.rpc_timeout)
        self._work.wait_idle(self._link.closed)
        if not current():
            return
        self._disarm_deadline()
        self._reporter.flush(self._o.rpc_timeout)
        with self._lock:
            if not current():
                return
            self._deadline_at = math.inf
            self._life.to("paused")

    def _resume(self, source: str) -> None:
        with self._lock:
            if self._leaving:
                return
            self._drain_epoch += 1
            self._disarm_deadline()
            self._deadline_at = math.inf
            if not self._life.to("running"):
                return
        self._log.info("undrained (%s): taking work again", source)
        self._channel.start_taking()

    def _shutdown_in_order(self, why: str) -> None:
        start = self.state
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
        self._disarm_deadline()
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
            self._link.deregister(self.name)
        self._close()
        self._life.to("stopped")

    def _fail(self, err: AgentFailedError) -> None:
        if is_terminal(self.state):
            return
        self._error = err
        self._log.error("agent failed: %s", err)
        self._life.to("failed")
        self._work.abandon_all(str(err))
        self._reporter.close(str(err))
        self._liveness.stop()
        self._channel.close()
        self._close()

    def _close(self) -> None:
        self._disarm_deadline()
        self._link.close()
        self._work.close()
        self._restore_signals()

    # ── Plumbing ────────────────────────────────────────────────────────────────────────────────

    def _work_hooks(self) -> WorkHooks:
        hooks = WorkHooks()
        hooks.item_started = lambda item: self._emit("item_started", item)
        hooks.item_finished = self._item_finished
        hooks.slot_freed = self._channel_top_up
        return hooks

    def _channel_top_up(self) -> None:
        self._channel.top_up()

    def _item_finished(self, item: WorkItem, outcome: Outcome) -> None:
        self._emit("item_finished", item, outcome)

    def _state_changed(self, state: str, previous: str) -> None:
        self._log.info("agent %s (was %s)", state, previous)
        self._emit("state", state, previous)

    def _emit(self, event: str, *args: Any) -> None:
        for fn in list(self._listeners[event]):
            try:
                fn(*args)
            except Exception:
                self._log.exception("an %s listener raised", event)

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            self._log.warning("handle_signals needs the agent started from the main thread: signals not handled")
            return
        count = {"n": 0}

        def on_signal(signum: int, _frame: Any) -> None:
            count["n"] += 1
            if count["n"] == 1:
                self._log.info("signal %d: draining (a second one stops at once)", signum)
                self.drain(wait=False)
            else:
                self._log.warning("second signal %d: stopping now", signum)
                self.stop(wait=False)

        for s in (signal.SIGTERM, signal.SIGINT):
            self._signals[s] = signal.signal(s, on_signal)

    def _restore_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            # Restored by whoever runs on the main thread next: signal.signal works only there.
            return
        for s, previous in self._signals.items():
            signal.signal(s, previous)
        self._signals.clear()


__all__ = ["Agent", "error_text"]
