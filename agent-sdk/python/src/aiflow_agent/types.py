"""What handlers receive and return, and how an item ended."""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Dict, Mapping, Optional, Tuple, Union

from ._wire import WireItem


class AgentFailedError(Exception):
    """The agent cannot go on: the daemon refused its token or its registration for good."""


class NonRetryableError(Exception):
    """Raised by a handler: the item fails for good (a dead letter), whatever retries it has left."""


class WorkAborted(Exception):
    """Raised by ``HandlerContext.check()`` once the item must stop; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"work aborted: {reason}")
        self.reason = reason


@dataclass(frozen=True)
class Requirements:
    """What an item needs of the agent, as its producer stated it. Memory and disk in MiB."""

    gpus: int = 0
    gpu_memory_mb: int = 0
    gpu_model: Optional[str] = None
    cpu_millis: int = 0
    memory_mb: int = 0
    disk_mb: int = 0
    disk_mount: Optional[str] = None


@dataclass(frozen=True)
class WorkItem:
    """A claimed work item. ``payload`` is parsed JSON from the producer: untrusted, validate it."""

    id: str
    tenant: str
    engine_kind: str
    engine_id: str
    run_id: Optional[str]
    task_id: Optional[str]
    task_name: Optional[str]
    parent_id: Optional[str]
    payload: Any
    #: 1 on the first try, 2 on the first retry, and so on.
    attempt: int
    max_retries: int
    #: Times the item came back after an agent running it lost its lease (not its own failures).
    redeliveries: int
    priority: int
    selector: Mapping[str, str]
    affinity_key: Optional[str]
    concurrency_key: Optional[str]
    rate_limit_key: Optional[str]
    requirements: Requirements
    #: The GPUs the daemon placed the item on, reserved for it while it runs.
    gpu_indices: Tuple[int, ...]
    idempotency_key: Optional[str]
    created_at: Optional[datetime]
    lease_token: str = field(repr=False)

    @property
    def cuda_visible_devices(self) -> str:
        """What to set ``CUDA_VISIBLE_DEVICES`` to in the environment of this item's GPU work
        (a child process's ``env``, not ``os.environ``, which items running side by side share)."""
        return ",".join(str(i) for i in self.gpu_indices)


def _opt(s: str) -> Optional[str]:
    return s if s != "" else None


def item_from_wire(w: WireItem) -> WorkItem:
    """A pushed item as handlers see it. A payload that is not JSON is handed over as its text."""
    payload: Any = None
    if w.payload_json != "":
        try:
            payload = json.loads(w.payload_json)
        except ValueError:
            payload = w.payload_json
    p = w.worker_params
    r = p.requirements
    created = None
    if w.HasField("created_on"):
        created = datetime.fromtimestamp(w.created_on.seconds + w.created_on.nanos / 1e9, tz=timezone.utc)
    return WorkItem(
        id=w.id,
        tenant=w.tenant_key,
        engine_kind=w.engine_kind,
        engine_id=w.engine_id,
        run_id=_opt(w.run_id),
        task_id=_opt(w.task_id),
        task_name=_opt(w.task_name),
        parent_id=_opt(w.parent_work_item_id),
        payload=payload,
        attempt=w.retry_count + 1,
        max_retries=w.max_retries,
        redeliveries=w.redelivery_count,
        priority=w.priority,
        selector=dict(p.selector),
        affinity_key=_opt(p.affinity_key),
        concurrency_key=_opt(p.concurrency_key),
        rate_limit_key=_opt(p.rate_limit_key),
        requirements=Requirements(
            gpus=r.gpus,
            gpu_memory_mb=r.gpu_memory_mb,
            gpu_model=_opt(r.gpu_model),
            cpu_millis=r.cpu_millis,
            memory_mb=r.memory_mb,
            disk_mb=r.disk_mb,
            disk_mount=_opt(r.disk_mount),
        ),
        gpu_indices=tuple(w.gpu_indices),
        idempotency_key=_opt(w.idempotency_key),
        created_at=created,
        lease_token=w.lease_token,
    )


class HandlerContext:
    """What a handler gets beside its item: its logger, and the word that it must stop.

    A synchronous handler polls ``cancelled`` (or calls ``check()``, or sleeps with ``wait()``, which
    wakes at once on cancellation); an ``async`` handler's task is also cancelled, so an ``await``
    raises ``asyncio.CancelledError``. Whatever a handler returns after it was told to stop is not
    reported: its lease is gone, it was cancelled, or a drain gave it back to the queue.
    """

    def __init__(self, agent: str, log: logging.LoggerAdapter[logging.Logger]) -> None:
        self.agent = agent
        self.log = log
        self._stop = threading.Event()
        self._reason: Optional[str] = None
        self._on_abort: Optional[Callable[[], None]] = None

    @property
    def cancelled(self) -> bool:
        return self._stop.is_set()

    @property
    def reason(self) -> Optional[str]:
        """Why the handler must stop: ``lease-lost: ...``, ``cancelled: ...`` or ``drain-deadline``."""
        return self._reason

    def check(self) -> None:
        """Raises WorkAborted once the handler must stop."""
        if self._stop.is_set():
            raise WorkAborted(self._reason or "aborted")

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Sleeps up to ``timeout`` seconds; True (at once) when the handler must stop."""
        return self._stop.wait(timeout)

    def _abort(self, reason: str) -> None:
        if self._stop.is_set():
            return
        self._reason = reason
        self._stop.set()
        hook = self._on_abort
        if hook is not None:
            hook()


JsonResult = Any
SyncHandler = Callable[[WorkItem, HandlerContext], JsonResult]
AsyncHandler = Callable[[WorkItem, HandlerContext], Awaitable[JsonResult]]
Handler = Union[SyncHandler, AsyncHandler]
#: Handlers by engine kind: a kind maps to one handler, or to handlers by task name. ``"*"`` takes
#: the kinds (or tasks) nothing else names.
Handlers = Mapping[str, Union[Handler, Mapping[str, Handler]]]


@dataclass(frozen=True)
class Outcome:
    """How an item ended.

    ``kind`` is one of: ``completed`` (the daemon took the result); ``failed`` (the daemon took the
    failure: it retries when ``retryable`` and retries are left); ``released`` (given back without
    spending an attempt: a drain); ``lease-lost`` (the lease was gone: nothing was reported);
    ``cancelled`` (a cancel directive stopped it); ``unreported`` (the report could not be
    delivered). ``detail`` holds the error or the reason.
    """

    kind: str
    detail: str = ""
    retryable: bool = False


@dataclass(frozen=True)
class Registration:
    """What a registration told the agent."""

    id: str
    address: str
    created: bool
    heartbeat_interval: float
    lease_ttl: float
    #: ``active``, ``draining`` (a drain survived a reconnect) or ``inactive``.
    status: str


JsonDict = Dict[str, Any]
