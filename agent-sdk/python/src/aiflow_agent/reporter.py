"""Reports (completions, failures, releases) on their way to the daemon, over the agent stream.

What must stay true:
- Every report is sent until it is answered: one whose call ended first waits for the next call
  (the lease token fences it, so one the daemon applied before the end is refused, never doubled).
- Answers reach ``on_answer`` exactly once per report; ``flush`` or ``close`` hands what is still
  unanswered to ``on_unanswered`` instead, once.
"""
from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, List, Union

from ._wire import WireOutcome, pb
from .stream import Channel, StreamClosed

Part = Union[pb.Completion, pb.Failure, pb.LeaseRef]


@dataclass
class Report:
    kind: str  # complete | fail | release
    part: Part
    #: The work run it reports (work.Run); opaque here.
    run: object
    #: When it was last sent (time.monotonic()); its answer's delay is the stream's round trip.
    sent_at: float = 0.0


class Reporter:
    def __init__(self, channel: Channel, on_answer: Callable[[Report, WireOutcome], None], on_unanswered: Callable[[Report, str], None]) -> None:
        self._channel = channel
        self._on_answer = on_answer
        self._on_unanswered = on_unanswered
        self._cond = threading.Condition()
        self._pending: List[Report] = []
        self._sent: List[Report] = []
        self._closed = False

    def submit(self, report: Report) -> None:
        with self._cond:
            if self._closed:
                closed = True
            else:
                closed = False
                self._pending.append(report)
        if closed:
            self._on_unanswered(report, "the agent stopped before it was reported")
            return
        self.pump()

    def pump(self) -> None:
        """Sends what waits, when the stream is open (called again when it opens)."""
        with self._cond:
            if not self._channel.ready or not self._pending:
                return
            batch, self._pending = self._pending, []
            for r in batch:
                try:
                    fut = self._channel.report(r.kind, r.part)
                except StreamClosed:
                    self._pending.append(r)
                    continue
                r.sent_at = time.monotonic()
                self._sent.append(r)
                fut.add_done_callback(functools.partial(self._answered, r))

    def _answered(self, r: Report, f: "Future[WireOutcome]") -> None:
        err = f.exception()
        with self._cond:
            if r not in self._sent:
                return
            self._sent.remove(r)
            if err is not None and not self._closed:
                self._pending.append(r)
            self._cond.notify_all()
        if err is None:
            self._on_answer(r, f.result())
        else:
            self.pump()

    def flush(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for every report to be answered; True when all were."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._sent:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
            return True

    def close(self, why: str = "the agent stopped") -> None:
        with self._cond:
            self._closed = True
            left = self._pending + self._sent
            self._pending, self._sent = [], []
            self._cond.notify_all()
        for r in left:
            self._on_unanswered(r, why)

    @property
    def outstanding(self) -> int:
        with self._cond:
            return len(self._pending) + len(self._sent)


__all__ = ["Report", "Reporter"]
