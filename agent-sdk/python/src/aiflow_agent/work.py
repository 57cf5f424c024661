"""Runs pushed items on their handlers, one slot each, and turns how they ended into reports.

Synchronous handlers run on a thread of their own each (a handler the agent stopped waiting for
keeps its thread, not a pool's); ``async`` handlers run as tasks on one event loop thread, and a
cancellation cancels the task.

What must stay true:
- A slot is taken from the moment an item is accepted until its handler returns or the item is
  aborted; ``room`` is the slots not taken, which is all the credits the stream grants.
- Each item ends once: reported (completed, failed, released) or dropped (lease lost, cancelled).
  What a handler returns after its item was aborted is not reported.
- A lease is held, and renewed, from accept until the item's report is answered or it is dropped.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._wire import WireItem, WireOutcome, pb
from .handlers import describe_handlers, resolve_handler
from .options import AgentOptions
from .reporter import Report, Reporter
from .types import Handler, HandlerContext, NonRetryableError, Outcome, WorkAborted, WorkItem, item_from_wire

FAILED_PRECONDITION = 9


class Run:
    def __init__(self, item: WorkItem, ctx: HandlerContext) -> None:
        self.item = item
        self.ctx = ctx
        #: Why it was aborted (lease-lost, cancelled, released), once it was.
        self.aborted: Optional[str] = None
        #: Its handler returned and its outcome is being reported.
        self.finished = False

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
        self._cond = threading.Condition()
        self._runs: Dict[str, Run] = {}
        self._busy = 0
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self.reporter: Optional[Reporter] = None

    # ── What the agent asks ─────────────────────────────────────────────────────────────────────

    @property
    def busy(self) -> int:
        """Handlers running now (slots taken)."""
        return self._busy

    def room(self) -> int:
        return max(0, self._opts.slots - self._busy)

    def held(self) -> List[Tuple[str, str]]:
        """(id, lease token) of every item whose lease the agent holds."""
        with self._cond:
            return [(r.item.id, r.token) for r in self._runs.values()]

    def wait_idle(self, stop: threading.Event) -> None:
        """Returns once no handler runs (or ``stop`` is set)."""
        with self._cond:
            while self._busy > 0 and not stop.is_set():
                self._cond.wait(0.25)

    def accept(self, items: List[WireItem], taking: bool) -> None:
        """Items pushed to the agent: each runs, or (when it stopped taking work) goes back."""
        for w in items:
            item = item_from_wire(w)
            ctx = HandlerContext(self._opts.name, logging.LoggerAdapter(self._log, {"item": item.id, "tenant": item.tenant, "engine_kind": item.engine_kind, "task": item.task_name, "attempt": item.attempt}))
            run = Run(item, ctx)
            with self._cond:
                self._runs[item.id] = run
                if taking:
                    self._busy += 1
            if not taking:
                run.aborted = "released"
                self._report(Report("release", pb.LeaseRef(work_item_id=item.id, lease_token=item.lease_token), run))
                continue
            self._start(run)

    def cancel(self, item_id: str, token: str, reason: str) -> None:
        self._abort(item_id, token, "cancelled", reason)

    def lease_lost(self, item_id: str, token: str, message: str) -> None:
        self._abort(item_id, token, "lease-lost", message)

    def release_running(self) -> None:
        """A drain deadline passed: what still runs is aborted and given back without spending an attempt."""
        with self._cond:
            running = [r for r in self._runs.values() if not r.finished and r.aborted is None]
        for r in running:
            self._abort(r.item.id, r.token, "released", "drain-deadline")

    def abandon_all(self, why: str) -> None:
        """The agent failed: every handler is told to stop, nothing more is reported."""
        with self._cond:
            runs = list(self._runs.values())
            self._runs.clear()
            self._busy = 0
            self._cond.notify_all()
        for r in runs:
            r.ctx._abort(f"agent failed: {why}")

    def close(self) -> None:
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)

    # ── Reports and their answers ───────────────────────────────────────────────────────────────

    def answered(self, report: Report, o: WireOutcome) -> None:
        run = report.run
        assert isinstance(run, Run)
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

    def _start(self, run: Run) -> None:
        item = run.item
        handler = resolve_handler(self._opts.handlers, item.engine_kind, item.task_name)
        self._safe(self.hooks.item_started, item)
        if handler is None:
            error = f"no handler for engine kind '{item.engine_kind}'" + (f", task '{item.task_name}'" if item.task_name else "") + f": this agent handles {describe_handlers(self._opts.handlers)}"
            self._settle(run, None, NonRetryableError(error))
            return
        if inspect.iscoroutinefunction(handler):
            self._submit_async(run, handler)
        else:
            threading.Thread(target=self._invoke, args=(run, handler), name=f"aiflow-item-{item.id}", daemon=True).start()

    def _invoke(self, run: Run, handler: Handler) -> None:
        try:
            result = handler(run.item, run.ctx)
            if inspect.isawaitable(result):
                result = asyncio.run_coroutine_threadsafe(_awaited(result), self._event_loop()).result()
        except BaseException as e:  # noqa: BLE001 — whatever a handler raises fails its item, never the agent
            self._settle(run, None, e)
            return
        self._settle(run, result, None)

    def _submit_async(self, run: Run, handler: Handler) -> None:
        fut = asyncio.run_coroutine_threadsafe(_awaited(handler(run.item, run.ctx)), self._event_loop())

        def cancel() -> None:
            fut.cancel()

        run.ctx._on_abort = cancel

        def done(f: "Any") -> None:
            if f.cancelled():
                self._settle(run, None, WorkAborted(run.ctx.reason or "cancelled"))
                return
            err = f.exception()
            self._settle(run, None if err else f.result(), err)

        fut.add_done_callback(done)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._cond:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="aiflow-agent-async", daemon=True).start()
                self._loop = loop
            return self._loop

    def _settle(self, run: Run, result: Any, err: Optional[BaseException]) -> None:
        """The handler returned (``result``) or raised (``err``): report it, unless it was aborted."""
        with self._cond:
            if run.aborted is not None or run.finished:
                return
            run.finished = True
            self._busy -= 1
            self._cond.notify_all()
        item = run.item
        if err is None:
            try:
                text = "" if result is None else json.dumps(result)
            except (TypeError, ValueError) as e:
                err = NonRetryableError(f"the handler's result is not JSON: {e}")
        if err is None:
            report = Report("complete", pb.Completion(work_item_id=item.id, lease_token=item.lease_token, result_json=text), run)
        else:
            retryable = not isinstance(err, NonRetryableError)
            message = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            if retryable:
                run.ctx.log.warning("handler failed (retryable): %s", message)
            else:
                run.ctx.log.error("handler failed: %s", message)
            report = Report("fail", pb.Failure(work_item_id=item.id, lease_token=item.lease_token, error=message[:4000], retryable=retryable), run)
        # The report is gathered before the credit the freed slot gives: they travel in one message.
        self._report(report)
        self._safe(self.hooks.slot_freed)

    def _abort(self, item_id: str, token: str, kind: str, reason: str) -> None:
        with self._cond:
            run = self._runs.get(item_id)
            if run is None or (token and run.token != token) or run.aborted is not None or run.finished:
                return
            run.aborted = kind
            self._busy -= 1
            self._cond.notify_all()
        run.ctx.log.info("item aborted (%s): %s", kind, reason)
        run.ctx._abort(reason if kind == "released" else f"{kind}: {reason}")
        if kind == "released":
            self._report(Report("release", pb.LeaseRef(work_item_id=item_id, lease_token=run.token), run))
        else:
            self._finished(run, Outcome(kind, reason))
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
