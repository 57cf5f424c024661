"""The agent's work channel (AgentService.Connect): one long-lived call that carries credits and
reports one way, and pushed items, outcomes, status and directives the other. Heartbeats and lease
renewals stay on the liveness thread (liveness.py), so a stream that is slow to answer never costs
the agent its leases.

What must stay true:
- Credits follow room: the credits granted on the current call and not yet used by a push never
  exceed the free slots the agent had when it granted them, so the daemon never pushes more than the
  agent can run.
- ``stop_taking()`` returns once the daemon answered the withdrawal (or the call ended): every item
  pushed under the old credits has arrived by then, since the stream is ordered.
- A report is answered on the call it was sent on, or its future fails when that call ends first;
  the reporter then sends it again on the next call (reports are fenced by lease token, so one
  applied before the end and sent again is refused, never applied twice).
- The end the agent chooses is a goodbye (its unreported items go back spending nothing); any other
  end the daemon sees as a break and requeues what it pushed, one redelivery spent.
- Whatever the agent adds while the request iterator waits travels as one message: completions and
  the credits their freed slots give ride together.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Callable, Dict, Iterator, List, Optional, Protocol

import grpc

from . import backoff
from ._wire import AgentStatus, StreamCall, WireItem, WireOutcome, pb
from .link import Link, error_text
from .options import AgentOptions
from .types import AgentFailedError

KINDS = ("complete", "fail", "release")


class StreamClosed(Exception):
    """The report could not travel: no call is open, or it ended before answering."""


class ChannelHooks(Protocol):
    def room(self) -> int:
        ...

    def on_items(self, items: List[WireItem]) -> None:
        ...

    def on_status(self, status: int) -> None:
        ...

    def on_directive(self, d: pb.Directive) -> None:
        ...

    def on_ready(self) -> None:
        ...


class _Call:
    """One open call: the message being gathered, the reports it owes answers for, and the
    withdrawals it owes an answer."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.pending: Optional[pb.ConnectRequest] = None
        self.ended = False
        self.settled = False
        self.ready = False
        self.useful = False
        self.waiting: Dict[str, Dict[str, "Future[WireOutcome]"]] = {k: {} for k in KINDS}
        self.withdrawals: List[threading.Event] = []
        self.rpc: Optional[StreamCall] = None

    def add(self, fill: Callable[[pb.ConnectRequest], None]) -> None:
        with self.cond:
            if self.pending is None:
                self.pending = pb.ConnectRequest()
            fill(self.pending)
            self.cond.notify_all()

    def end(self) -> None:
        """Half-closes after what is gathered."""
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def requests(self) -> Iterator[pb.ConnectRequest]:
        while True:
            with self.cond:
                while self.pending is None and not self.ended:
                    self.cond.wait()
                msg, self.pending = self.pending, None
            if msg is None:
                return
            yield msg

    def settle(self, err: BaseException) -> None:
        """The call is over: reports it owes fail, withdrawals it owes are let go."""
        with self.cond:
            self.settled = True
            self.ended = True
            self.pending = None
            self.cond.notify_all()
            futures = [f for m in self.waiting.values() for f in m.values()]
            for m in self.waiting.values():
                m.clear()
            events, self.withdrawals = self.withdrawals, []
        for f in futures:
            if not f.done():
                f.set_exception(StreamClosed(error_text(err)))
        for e in events:
            e.set()


class Channel:
    def __init__(self, link: Link, opts: AgentOptions, log: logging.Logger, hooks: ChannelHooks) -> None:
        self._link = link
        self._opts = opts
        self._log = log
        self._hooks = hooks
        self._lock = threading.RLock()
        self._call: Optional[_Call] = None
        self._taking = False
        self._leaving = False
        self._granted = 0
        self._closed = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def open(self) -> None:
        """Opens the stream, and keeps it open until goodbye() or close()."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="aiflow-agent-stream", daemon=True)
            self._thread.start()

    @property
    def ready(self) -> bool:
        """A call the daemon answered is open: reports can travel on it."""
        call = self._call
        return call is not None and call.ready and not call.settled

    def start_taking(self) -> None:
        with self._lock:
            self._taking = True
        self.top_up()

    def top_up(self) -> None:
        """Grants credits for the room not yet covered by credits outstanding."""
        with self._lock:
            call = self._call
            if not self._taking or call is None:
                return
            more = self._hooks.room() - self._granted
            if more <= 0:
                return
            self._granted += more

            def fill(m: pb.ConnectRequest) -> None:
                m.credits += more

            call.add(fill)

    def stop_taking(self, timeout: float) -> None:
        """Takes no more work; returns once the daemon answered the withdrawal (or the call ended,
        or ``timeout`` seconds passed)."""
        answered = threading.Event()
        with self._lock:
            self._taking = False
            self._granted = 0
            call = self._call
            if call is None:
                return

            def fill(m: pb.ConnectRequest) -> None:
                m.credits = 0
                m.withdraw_credits = True

            with call.cond:
                if call.settled:
                    return
                call.withdrawals.append(answered)
            call.add(fill)
        answered.wait(timeout)

    def report(self, kind: str, part: "pb.Completion | pb.Failure | pb.LeaseRef") -> "Future[WireOutcome]":
        """Sends one report on the open call; its future is its outcome, or StreamClosed."""
        call = self._call
        if call is None or not call.ready:
            raise StreamClosed("the agent stream is not open")
        fut: "Future[WireOutcome]" = Future()
        with call.cond:
            if call.settled:
                raise StreamClosed("the agent stream ended")
            call.waiting[kind][part.work_item_id] = fut
            if call.pending is None:
                call.pending = pb.ConnectRequest()
            m = call.pending
            if isinstance(part, pb.Completion):
                m.completions.append(part)
            elif isinstance(part, pb.Failure):
                m.failures.append(part)
            else:
                m.releases.append(part)
            call.cond.notify_all()
        return fut

    def goodbye(self, timeout: float) -> None:
        """Says goodbye and waits (at most ``timeout``) for the daemon to end the stream, which is not
        opened again. Everything reported must have been answered before this."""
        with self._lock:
            self._leaving = True
            self._taking = False
            call = self._call
        if call is not None:
            call.add(lambda m: setattr(m, "goodbye", True))
            call.end()
            if self._thread is not None:
                self._thread.join(timeout)
        self.close()

    def close(self) -> None:
        """Ends the stream where it stands (the daemon sees a break) and opens it no more."""
        with self._lock:
            self._leaving = True
            call = self._call
        self._closed.set()
        if call is not None and call.rpc is not None:
            call.rpc.cancel()

    def _run(self) -> None:
        failures = 0
        while not self._leaving:
            generation = self._link.generation
            call = _Call()
            failed: BaseException
            try:
                self._converse(call)
                failed = StreamClosed("the daemon ended the agent stream")
            except grpc.RpcError as e:
                failed = e
            except Exception as e:  # a hook that raised: the stream starts again rather than dying
                self._log.exception("agent stream: unexpected error")
                failed = e
            finally:
                with self._lock:
                    if self._call is call:
                        self._call = None
                    self._granted = 0
            call.settle(failed)
            if self._leaving:
                return
            self._log.debug("agent stream ended (%s): reopening", error_text(failed))
            failures = 0 if call.useful else failures + 1
            try:
                self._link.recover(generation, failed, self._closed)
            except AgentFailedError:
                return
            # A daemon that ends every stream at once (shutting down, say) is not hammered.
            if failures > 0 and self._closed.wait(backoff.delay(failures - 1, self._opts.reconnect)):
                return

    def _converse(self, call: _Call) -> None:
        with self._lock:
            if self._leaving:
                return
            self._call = call
            self._granted = 0
        name = self._opts.name
        call.add(lambda m: setattr(m, "name", name))
        self.top_up()
        call.rpc = self._link.stub.Connect(call.requests(), metadata=self._link.metadata)
        if self._closed.is_set():
            call.rpc.cancel()
        for res in call.rpc:
            self._receive(call, res)

    def _receive(self, call: _Call, res: pb.ConnectResponse) -> None:
        if call.ready:
            call.useful = True
        else:
            call.ready = True
            self._hooks.on_ready()
        status_directive = False
        for d in res.directives:
            status_directive = status_directive or d.WhichOneof("kind") == "status"
            self._hooks.on_directive(d)
        if not status_directive and res.status != AgentStatus.AGENT_STATUS_UNSPECIFIED:
            self._hooks.on_status(res.status)
        if res.refused:
            self._log.warning("the daemon refused part of a stream message: %s", res.refused)
        if res.items:
            with self._lock:
                self._granted = max(0, self._granted - len(res.items))
            self._hooks.on_items(list(res.items))
            self.top_up()
        for kind, outcomes in (("release", res.release_outcomes), ("fail", res.failure_outcomes), ("complete", res.completion_outcomes)):
            for o in outcomes:
                with call.cond:
                    fut = call.waiting[kind].pop(o.work_item_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(o)
        if res.credits_withdrawn:
            with call.cond:
                ev = call.withdrawals.pop(0) if call.withdrawals else None
            if ev is not None:
                ev.set()
