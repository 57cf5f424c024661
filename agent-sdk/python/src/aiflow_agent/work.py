"""The items on this agent: starting their handlers, the slots they hold, their outcomes.

Synchronous handlers run on the agent's slot threads, one per slot, started once; ``async``
handlers run as tasks on one event loop thread, and a cancellation cancels the task. Items taken
ahead of a free slot (claim_ahead.py) wait, leased, in the order they came; a drain gives them back.

What must stay true:
- A handler holds its slot until it returns, even after its item was aborted, since its code may
  still be using the machine; what it returns after an abort is dropped, because the item's outcome
  was settled at the abort (lease lost, cancelled, or given back). So the slots taken never exceed
  ``slots``, and one thread per slot is always enough.
- ``room`` (all the credits the stream grants) is the slots and the ahead allowance, less the
  slots taken and the items waiting: the agent never holds more than it can run or start soon.
- Each item ends once: reported (completed, failed, released) or dropped (lease lost, cancelled).
- A lease is held, and renewed, from accept until the item's report is answered or it is dropped.
"""
from __future__ import annotations

import asyncio
import collections
import inspect
import json
import logging
import queue
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from ._wire import WireItem, WireOutcome, pb
from .claim_ahead import ClaimAhead
from .handlers import describe_handlers, resolve_handler
from .options import AgentOptions
from .reporter import Report, Reporter
from .types import Handler, HandlerContext, NonRetryableError, Outcome, WorkAborted, WorkItem, item_from_wire

FAILED_PRECONDITION = 9


class Run:
    def __init__(self, item: WorkItem, ctx: HandlerContext) -> None:
        self.item = item
        self.ctx = ctx
        #: waiting (for a slot), running, reporting, or aborted (its outcome settled at the abort).
        self.phase = "waiting"

    @property
    def token(self) -> str:
        return self.item.lease_token


class WorkHooks:
    """What the agent hears of the work (set by the agent after construction)."""

    item_started: Callable[[WorkItem], None] = staticmethod(lambda item: None)
    item_finished: Callable[[WorkItem, Outcome], None] = staticmethod(lambda item, outcome: None)
    #: A slot came free: the stream may grant a credit for it.
    slot_freed: Callable[[], None] = staticmethod(lambda: None)


class Work:
    def __init__(self, opts: AgentOptions, log: logging.Logger, hooks: WorkHooks) -> None:
        self._opts = opts
        self._log = log
        self.hooks = hooks
        self.ahead = ClaimAhead(opts.slots, opts.resolved_prefetch())
        self._cond = threading.Condition()
        self._runs: Dict[str, Run] = {}
        self._waiting: Deque[Run] = collections.deque()
        #: Runs whose handler runs and whose item was not aborted: what a drain waits for.
        self._running: Set[Run] = set()
        #: Slots taken: handlers executing, aborted or not.
        self._busy = 0
        self._jobs: "queue.SimpleQueue[Optional[Tuple[Run, Handler]]]" = queue.SimpleQueue()
        self._threads: List[threading.Thread] = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self.reporter: Optional[Reporter] = None

    # ── What the agent asks ─────────────────────────────────────────────────────────────────────

    @property
    def busy(self) -> int:
        """Slots taken now (handlers executing)."""
        return self._busy

    def room(self) -> int:
        with self._cond:
            return max(0, self._opts.slots + self.ahead.allowance - self._busy - len(self._waiting))

    def held(self) -> List[Tuple[str, str]]:
        """(id, lease token) of every item whose lease the agent holds."""
        with self._cond:
            return [(r.item.id, r.token) for r in self._runs.values()]

    def wait_idle(self, stop: threading.Event) -> None:
        """Returns once no item runs unaborted (or ``stop`` is set)."""
        with self._cond:
            while self._running and not stop.is_set():
                self._cond.wait(0.25)

    def accept(self, items: List[WireItem], taking: bool) -> None:
        """Items pushed to the agent: each runs, waits for a slot, or (when it stopped taking work) goes back."""
        start: List[Run] = []
        back: List[Run] = []
        with self._cond:
            for w in items:
                item = item_from_wire(w)
                log = logging.LoggerAdapter(
                    self._log, {"item": item.id, "tenant": item.tenant, "engine_kind": item.engine_kind, "task": item.task_name, "attempt": item.attempt}
                )
                run = Run(item, HandlerContext(self._opts.name, log))
                self._runs[item.id] = run
                if not taking:
                    run.phase = "aborted"
                    back.append(run)
                elif self._busy < self._opts.slots:
                    self._take_slot(run)
                    start.append(run)
                else:
                    self._waiting.append(run)
        for run in back:
            self._report(Report("release", pb.LeaseRef(work_item_id=run.item.id, lease_token=run.token), run))
        for run in start:
            self._start(run)

    def cancel(self, item_id: str, token: str, reason: str) -> None:
        self._abort(item_id, token, "cancelled", reason)

    def lease_lost(self, item_id: str, token: str, message: str) -> None:
        self._abort(item_id, token, "lease-lost", message)

    def release_waiting(self, at_deadline: bool = False) -> None:
        """A drain began: items waiting for a slot would not start before it ends, so others run them.

        ``at_deadline``: the drain's deadline passed first; the release says so (LeaseRef.drain_deadline)
        and the daemon counts it in the drain's result, as it would count its own release at the deadline.
        """
        with self._cond:
            waiting = list(self._waiting)
        for r in waiting:
            self._abort(r.item.id, r.token, "released", "the agent is draining: given back before it started", at_deadline)

    def release_running(self) -> None:
        """A drain deadline passed: what still runs is aborted and given back without spending an attempt."""
        self.release_waiting(at_deadline=True)
        with self._cond:
            running = list(self._running)
        for r in running:
            self._abort(r.item.id, r.token, "released", "drain-deadline", True)

    def abandon_all(self, why: str) -> None:
        """The agent failed: every handler is told to stop, nothing more is reported."""
        with self._cond:
            runs = list(self._runs.values())
            self._runs.clear()
            self._waiting.clear()
            self._running.clear()
            self._cond.notify_all()
        for r in runs:
            r.ctx._abort(f"agent failed: {why}")

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)

    # ── Reports and their answers ───────────────────────────────────────────────────────────────

    def answered(self, report: Report, o: WireOutcome) -> None:
        run = report.run
        assert isinstance(run, Run)
        self.ahead.round_trip_took(time.monotonic() - report.sent_at)
        if o.ok:
            if report.kind == "complete":
                outcome = Outcome("completed")
            elif report.kind == "fail":
                assert isinstance(report.part, pb.Failure)
                outcome = Outcome("failed", report.part.error, report.part.retryable)
            else:
                outcome = Outcome("released")
        elif o.code == FAILED_PRECONDITION:
            outcome = Outcome("lease-lost", o.message or "lease lost")
        else:
            self._log.error("the daemon refused the %s of item %s: %s", report.kind, run.item.id, o.message)
            outcome = Outcome("unreported", f"refused: {o.message}")
        self._finished(run, outcome)

    def unanswered(self, report: Report, why: str) -> None:
        run = report.run
        assert isinstance(run, Run)
        self._finished(run, Outcome("unreported", why))

    # ── Running ─────────────────────────────────────────────────────────────────────────────────

    def _take_slot(self, run: Run) -> None:
        """Under the lock: the run takes a slot."""
        run.phase = "running"
        self._busy += 1
        self._running.add(run)

    def _start(self, run: Run) -> None:
        item = run.item
        handler = resolve_handler(self._opts.handlers, item.engine_kind, item.task_name)
        self._safe(self.hooks.item_started, item)
        if handler is None:
            error = (
                f"no handler for engine kind '{item.engine_kind}'"
                + (f", task '{item.task_name}'" if item.task_name else "")
                + f": this agent handles {describe_handlers(self._opts.handlers)}"
            )
            self._settle(run, time.monotonic(), None, NonRetryableError(error))
        elif inspect.iscoroutinefunction(handler):
            self._submit_async(run, handler)
        else:
            self._ensure_threads()
            self._jobs.put((run, handler))

    def _ensure_threads(self) -> None:
        if self._threads:
            return
        with self._cond:
            if self._threads:
                return
            for i in range(self._opts.slots):
                t = threading.Thread(target=self._slot_thread, name=f"aiflow-slot-{i}", daemon=True)
                t.start()
                self._threads.append(t)

    def _slot_thread(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            run, handler = job
            started = time.monotonic()
            try:
                result = handler(run.item, run.ctx)
                if inspect.isawaitable(result):
                    result = asyncio.run_coroutine_threadsafe(_awaited(result), self._event_loop()).result()
            except BaseException as e:  # noqa: BLE001 — whatever a handler raises fails its item, never the agent
                self._settle(run, started, None, e)
                continue
            self._settle(run, started, result, None)

    def _submit_async(self, run: Run, handler: Handler) -> None:
        started = time.monotonic()
        fut = asyncio.run_coroutine_threadsafe(_awaited(handler(run.item, run.ctx)), self._event_loop())

        def cancel() -> None:
            fut.cancel()

        run.ctx._on_abort = cancel

        def done(f: Any) -> None:
            if f.cancelled():
                self._settle(run, started, None, WorkAborted(run.ctx.reason or "cancelled"))
                return
            err = f.exception()
            self._settle(run, started, None if err else f.result(), err)

        fut.add_done_callback(done)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._cond:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="aiflow-agent-async", daemon=True).start()
                self._loop = loop
            return self._loop

    def _settle(self, run: Run, started: float, result: Any, err: Optional[BaseException]) -> None:
        """The handler returned (``result``) or raised (``err``): its outcome is reported unless the
        item was aborted meanwhile, and its slot frees."""
        self.ahead.handler_took(time.monotonic() - started)
        with self._cond:
            reporting = run.phase == "running"
            if reporting:
                run.phase = "reporting"
        # Submitted before the run stops counting as running: a drain that waits for nothing to run
        # and then for every report finds this one among them. And before the credit the freed slot
        # gives, so that the two travel in one message.
        if reporting:
            self._report(self._report_of(run, result, err))
        start: List[Run] = []
        with self._cond:
            self._busy -= 1
            self._running.discard(run)
            # A waiting item takes the slot before it is announced free.
            while self._busy < self._opts.slots and self._waiting:
                nxt = self._waiting.popleft()
                self._take_slot(nxt)
                start.append(nxt)
            self._cond.notify_all()
        for r in start:
            self._start(r)
        self._safe(self.hooks.slot_freed)

    def _report_of(self, run: Run, result: Any, err: Optional[BaseException]) -> Report:
        item = run.item
        if err is None:
            try:
                text = "" if result is None else json.dumps(result)
            except (TypeError, ValueError) as e:
                err = NonRetryableError(f"the handler's result is not JSON: {e}")
            else:
                return Report("complete", pb.Completion(work_item_id=item.id, lease_token=item.lease_token, result_json=text), run)
        retryable = not isinstance(err, NonRetryableError)
        message = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        if retryable:
            run.ctx.log.warning("handler failed (retryable): %s", message)
        else:
            run.ctx.log.error("handler failed: %s", message)
        return Report("fail", pb.Failure(work_item_id=item.id, lease_token=item.lease_token, error=message[:4000], retryable=retryable), run)

    def _abort(self, item_id: str, token: str, kind: str, reason: str, at_deadline: bool = False) -> None:
        with self._cond:
            run = self._runs.get(item_id)
            if run is None or (token and run.token != token) or run.phase not in ("waiting", "running"):
                return
            if run.phase == "waiting":
                self._waiting.remove(run)
            run.phase = "aborted"
        run.ctx.log.info("item aborted (%s): %s", kind, reason)
        run.ctx._abort(reason if kind == "released" else f"{kind}: {reason}")
        if kind == "released":
            self._report(Report("release", pb.LeaseRef(work_item_id=item_id, lease_token=run.token, drain_deadline=at_deadline), run))
        else:
            self._finished(run, Outcome(kind, reason))
        # Only now is it no longer running: a drain waiting for that finds its release submitted.
        with self._cond:
            self._running.discard(run)
            self._cond.notify_all()
        self._safe(self.hooks.slot_freed)

    def _report(self, report: Report) -> None:
        assert self.reporter is not None
        self.reporter.submit(report)

    def _finished(self, run: Run, outcome: Outcome) -> None:
        with self._cond:
            if self._runs.get(run.item.id) is run:
                del self._runs[run.item.id]
        self._safe(self.hooks.item_finished, run.item, outcome)

    def _safe(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            self._log.exception("an agent hook raised")


async def _awaited(aw: Any) -> Any:
    return await aw
