from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
WORK_ITEM_STATUS_CANCELLED: WorkItemStatus
WORK_ITEM_STATUS_COMPLETED: WorkItemStatus
WORK_ITEM_STATUS_DISPATCHED: WorkItemStatus
WORK_ITEM_STATUS_FAILED: WorkItemStatus
WORK_ITEM_STATUS_PENDING: WorkItemStatus
WORK_ITEM_STATUS_UNSPECIFIED: WorkItemStatus

class ChildCounts(_message.Message):
    __slots__ = ["cancelled", "completed", "dispatched", "failed", "pending"]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    cancelled: int
    completed: int
    dispatched: int
    failed: int
    pending: int
    def __init__(self, pending: _Optional[int] = ..., dispatched: _Optional[int] = ..., completed: _Optional[int] = ..., failed: _Optional[int] = ..., cancelled: _Optional[int] = ...) -> None: ...

class ItemOutcome(_message.Message):
    __slots__ = ["code", "message", "ok", "work_item_id"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    WORK_ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    ok: bool
    work_item_id: str
    def __init__(self, work_item_id: _Optional[str] = ..., ok: bool = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class Requirements(_message.Message):
    __slots__ = ["cpu_millis", "disk_mb", "disk_mount", "gpu_memory_mb", "gpu_model", "gpus", "memory_mb"]
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    DISK_MB_FIELD_NUMBER: _ClassVar[int]
    DISK_MOUNT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    cpu_millis: int
    disk_mb: int
    disk_mount: str
    gpu_memory_mb: int
    gpu_model: str
    gpus: int
    memory_mb: int
    def __init__(self, gpus: _Optional[int] = ..., gpu_memory_mb: _Optional[int] = ..., gpu_model: _Optional[str] = ..., cpu_millis: _Optional[int] = ..., memory_mb: _Optional[int] = ..., disk_mb: _Optional[int] = ..., disk_mount: _Optional[str] = ...) -> None: ...

class WorkItem(_message.Message):
    __slots__ = ["agent_id", "completed_at_ns", "created_on", "dispatched_at_ns", "engine_id", "engine_kind", "error", "gpu_indices", "id", "idempotency_key", "lease_expires_at_ns", "lease_token", "leased_by", "max_redeliveries", "max_retries", "next_attempt_at_ns", "parent_work_item_id", "payload_json", "priority", "redelivery_count", "result_json", "retry_count", "run_id", "status", "task_id", "task_name", "tenant_key", "trace_context", "unplaceable", "updated_on", "worker_params"]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    CREATED_ON_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    LEASED_BY_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_NS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MAX_REDELIVERIES_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_AT_NS_FIELD_NUMBER: _ClassVar[int]
    PARENT_WORK_ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    REDELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    RETRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    UNPLACEABLE_FIELD_NUMBER: _ClassVar[int]
    UPDATED_ON_FIELD_NUMBER: _ClassVar[int]
    WORKER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    completed_at_ns: int
    created_on: _timestamp_pb2.Timestamp
    dispatched_at_ns: int
    engine_id: str
    engine_kind: str
    error: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    id: str
    idempotency_key: str
    lease_expires_at_ns: int
    lease_token: str
    leased_by: str
    max_redeliveries: int
    max_retries: int
    next_attempt_at_ns: int
    parent_work_item_id: str
    payload_json: str
    priority: int
    redelivery_count: int
    result_json: str
    retry_count: int
    run_id: str
    status: WorkItemStatus
    task_id: str
    task_name: str
    tenant_key: str
    trace_context: str
    unplaceable: str
    updated_on: _timestamp_pb2.Timestamp
    worker_params: WorkerParams
    def __init__(self, id: _Optional[str] = ..., tenant_key: _Optional[str] = ..., engine_id: _Optional[str] = ..., engine_kind: _Optional[str] = ..., parent_work_item_id: _Optional[str] = ..., run_id: _Optional[str] = ..., task_id: _Optional[str] = ..., task_name: _Optional[str] = ..., worker_params: _Optional[_Union[WorkerParams, _Mapping]] = ..., payload_json: _Optional[str] = ..., status: _Optional[_Union[WorkItemStatus, str]] = ..., priority: _Optional[int] = ..., agent_id: _Optional[str] = ..., dispatched_at_ns: _Optional[int] = ..., completed_at_ns: _Optional[int] = ..., lease_expires_at_ns: _Optional[int] = ..., leased_by: _Optional[str] = ..., lease_token: _Optional[str] = ..., next_attempt_at_ns: _Optional[int] = ..., retry_count: _Optional[int] = ..., max_retries: _Optional[int] = ..., error: _Optional[str] = ..., result_json: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., created_on: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., updated_on: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., redelivery_count: _Optional[int] = ..., max_redeliveries: _Optional[int] = ..., trace_context: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., unplaceable: _Optional[str] = ...) -> None: ...

class WorkerParams(_message.Message):
    __slots__ = ["affinity_key", "concurrency_key", "max_in_flight", "rate_limit_key", "requirements", "selector"]
    class SelectorEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AFFINITY_KEY_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_KEY_FIELD_NUMBER: _ClassVar[int]
    REQUIREMENTS_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    affinity_key: str
    concurrency_key: str
    max_in_flight: int
    rate_limit_key: str
    requirements: Requirements
    selector: _containers.ScalarMap[str, str]
    def __init__(self, selector: _Optional[_Mapping[str, str]] = ..., affinity_key: _Optional[str] = ..., requirements: _Optional[_Union[Requirements, _Mapping]] = ..., concurrency_key: _Optional[str] = ..., max_in_flight: _Optional[int] = ..., rate_limit_key: _Optional[str] = ...) -> None: ...

class WorkItemStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
