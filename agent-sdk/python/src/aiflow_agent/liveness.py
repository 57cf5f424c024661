"""Heartbeats and lease renewals, from a thread of their own.

A handler cannot starve this thread: grpcio does its I/O on threads of its own, and a Python thread
that computes gives up the interpreter every few milliseconds (``sys.getswitchinterval()``). A
handler running native code that holds the interpreter lock for longer than a heartbeat interval
(some C extensions do) belongs in a child process.

What must stay true:
- Every lease the agent holds is renewed every third of the daemon's lease TTL, so a lease is renewed
  at least twice before it could expire. Ticks are local time: the daemon's clock is never compared
  with ours.
- A renewal the daemon refuses means the lease is gone; the item is aborted (``on_lost``). A renewal
  or a beat that fails in transit is tried again on the next tick.
- One bad beat never ends liveness: failures are logged once per outage and the loop goes on.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, List, Optional, Tuple

import grpc

from ._wire import pb
from .link import Link, error_text
from .options import AgentOptions
from .resources import Sampler

#: The daemon's batch limit for one ExtendLease.
MAX_BATCH = 10_000


class Liveness:
    def __init__(
        self,
        link: Link,
        opts: AgentOptions,
        log: logging.Logger,
        in_flight: Callable[[], int],
        held: Callable[[], List[Tuple[str, str]]],
        on_reply: Callable[[pb.HeartbeatResponse], None],
        on_not_found: Callable[[], None],
        on_lost: Callable[[str, str, str], None],
    ) -> None:
        self._link = link
        self._opts = opts
        self._log = log
        self._in_flight = in_flight
        self._held = held
        self._on_reply = on_reply
        self._on_not_found = on_not_found
        self._on_lost = on_lost
        self._sampler: Optional[Sampler] = None
        self._interval = 5.0
        self._ttl = 30.0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._beat_failures = 0
        self._renew_failures = 0

    def start(self, sampler: Sampler, interval: float, ttl: float) -> None:
        self._sampler = sampler
        self.retime(interval, ttl)
        self._thread = threading.Thread(target=self._loop, name="aiflow-agent-liveness", daemon=True)
        self._thread.start()

    def retime(self, interval: float, ttl: float) -> None:
        self._interval = max(0.05, interval)
        self._ttl = max(0.15, ttl)
        self._wake.set()

    def beat_now(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self._opts.rpc_timeout)

    def _loop(self) -> None:
        next_beat = time.monotonic()
        next_renew = time.monotonic() + self._ttl / 3
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                self._beat()
                next_beat = time.monotonic() + self._interval
            if now >= next_renew:
                self._renew()
                next_renew = time.monotonic() + self._ttl / 3
            wait = max(0.0, min(next_beat, next_renew) - time.monotonic())
            if self._wake.wait(wait):
                self._wake.clear()
                # Retimed: the next tick follows the new figures.
                next_beat = min(next_beat, time.monotonic() + self._interval)
                next_renew = min(next_renew, time.monotonic() + self._ttl / 3)

    def _beat(self) -> None:
        assert self._sampler is not None
        req = pb.HeartbeatRequest(name=self._opts.name, metrics=self._sampler.sample(), in_flight=self._in_flight())
        try:
            reply = self._link.stub.Heartbeat(req, timeout=min(self._opts.rpc_timeout, max(1.0, self._interval * 2)), metadata=self._link.metadata)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                self._log.warning("the daemon does not know this agent: registering again")
                self._on_not_found()
            elif self._beat_failures == 0:
                self._log.warning("heartbeat failed (%s): trying again every interval", error_text(e))
            self._beat_failures += 1
            return
        if self._beat_failures > 0:
            self._log.info("heartbeats answered again after %d failures", self._beat_failures)
        self._beat_failures = 0
        self._on_reply(reply)

    def _renew(self) -> None:
        held = self._held()
        for start in range(0, len(held), MAX_BATCH):
            batch = held[start : start + MAX_BATCH]
            req = pb.ExtendLeaseRequest(name=self._opts.name, leases=[pb.LeaseRef(work_item_id=i, lease_token=t) for i, t in batch])
            try:
                res = self._link.stub.ExtendLease(req, timeout=self._opts.rpc_timeout, metadata=self._link.metadata)
            except grpc.RpcError as e:
                if self._renew_failures == 0:
                    self._log.warning("lease renewal failed (%s): trying again next tick", error_text(e))
                self._renew_failures += 1
                return
            self._renew_failures = 0
            tokens = dict(batch)
            for o in res.outcomes:
                if not o.ok and o.work_item_id in tokens:
                    self._on_lost(o.work_item_id, tokens[o.work_item_id], o.message or "lease lost")
