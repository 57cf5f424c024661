"""The agent: registers (with the capacity it detects at start), heartbeats and renews its leases
from a thread of its own (liveness.py), takes work over the agent stream for its free slots
(stream.py), runs the handlers (work.py), reports outcomes (reporter.py), follows the daemon's
directives, and survives the daemon going away (link.py).

Shutdown (drain(), stop(), a signal, the daemon's drain) runs in one order, and a drain the daemon
orders pauses the agent instead of stopping it: shutdown.py says how.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from ._wire import AgentStub, WireItem, pb
from .lifecycle import Lifecycle, is_terminal
from .link import Link, error_text
from .liveness import Liveness
from .options import AgentOptions, Capacity
from .registration import STATUS, register
from .reporter import Reporter
from .resources import Detected, Sampler, detect_capacity, disk_mounts
from .shutdown import Shutdown
from .signals import SignalHandlers
from .stream import Channel
from .types import AgentFailedError, Outcome, Registration, WorkItem
from .work import Work, WorkHooks

EVENTS = ("state", "registered", "disconnected", "item_started", "item_finished")


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
        self._registration: Optional[Registration] = None
        self._capacity: Optional[Detected] = None
        self._error: Optional[AgentFailedError] = None
        self._signals = SignalHandlers(self._log, lambda: self.drain(wait=False), lambda: self.stop(wait=False))
        self._link = Link(o, self._log, self._register, lambda e: self._emit("disconnected", e), self._fail)
        self._work = Work(o, self._log, self._work_hooks())
        self._channel = Channel(self._link, o, self._log, self)
        self._reporter = Reporter(self._channel, self._work.answered, self._work.unanswered)
        self._work.reporter = self._reporter
        self._liveness = Liveness(
            self._link,
            o,
            self._log,
            lambda: self._work.busy,
            self._work.held,
            self._heartbeat_reply,
            lambda: self._reregister("the daemon does not know this agent"),
            self._work.lease_lost,
        )
        self._shutdown = Shutdown(o, self._log, self._life, self._link, self._work, self._channel, self._reporter, self._liveness, self._close)

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
            self._signals.install()
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
        self._signals.restore()
        if self._error is not None:
            raise self._error

    def wait(self, timeout: Optional[float] = None) -> str:
        """Waits (up to ``timeout`` seconds) until the agent stopped or failed; returns the state."""
        self._life.wait_for(is_terminal, timeout)
        return self.state

    def drain(self, deadline: Optional[float] = None, wait: bool = True) -> None:
        """Shuts down gracefully (see the order in shutdown.py); ``deadline`` is seconds from now
        (default ``graceful_shutdown``). With ``wait``, returns once stopped."""
        at = time.monotonic() + (self._o.graceful_shutdown if deadline is None else deadline)
        self._shutdown.begin(at, "drain requested", wait)

    def stop(self, wait: bool = True) -> None:
        """Shuts down now: in-flight items are aborted and given back, then the agent deregisters."""
        self._shutdown.begin(time.monotonic(), "stop requested", wait)

    # ── Registration ────────────────────────────────────────────────────────────────────────────

    def _register(self, stub: AgentStub, address: str) -> None:
        reg = register(stub, address, self._o, self._capacity, self._link.metadata)
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
                    self._shutdown.begin(at, why, False)
                else:
                    threading.Thread(target=self._shutdown.pause_for_daemon, args=(at, why), name="aiflow-agent-drain", daemon=True).start()
            elif state == "draining" and deadline_at is not None:
                self._shutdown.tighten(deadline_at)
        elif status == "active" and (state == "paused" or (state == "draining" and not self._shutdown.leaving)):
            self._shutdown.resume(source)
        elif status == "inactive" and state in ("running", "paused"):
            self._reregister(f"the daemon marked this agent inactive ({source})")

    # ── The end ─────────────────────────────────────────────────────────────────────────────────

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
        self._shutdown.disarm()
        self._link.close()
        self._work.close()
        self._signals.restore()

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


__all__ = ["Agent", "error_text"]
