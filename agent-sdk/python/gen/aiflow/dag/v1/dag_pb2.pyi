from aiflow.cluster.v1 import work_item_pb2 as _work_item_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

AFFINITY_RUN: Affinity
AFFINITY_UNSPECIFIED: Affinity
ATTEMPT_STATUS_CANCELLED: AttemptStatus
ATTEMPT_STATUS_COMPLETED: AttemptStatus
ATTEMPT_STATUS_FAILED: AttemptStatus
ATTEMPT_STATUS_QUEUED: AttemptStatus
ATTEMPT_STATUS_RUNNING: AttemptStatus
ATTEMPT_STATUS_UNSPECIFIED: AttemptStatus
ATTEMPT_STATUS_WAITING: AttemptStatus
DESCRIPTOR: _descriptor.FileDescriptor
NODE_KIND_TASK: NodeKind
NODE_KIND_UNSPECIFIED: NodeKind
NODE_KIND_WAIT: NodeKind
NODE_STATUS_CANCELLED: NodeStatus
NODE_STATUS_COMPLETED: NodeStatus
NODE_STATUS_FAILED: NodeStatus
NODE_STATUS_PENDING: NodeStatus
NODE_STATUS_RUNNING: NodeStatus
NODE_STATUS_SKIPPED: NodeStatus
NODE_STATUS_UNSPECIFIED: NodeStatus
NODE_STATUS_WAITING: NodeStatus
ON_FAILURE_FAIL_RUN: OnFailure
ON_FAILURE_SKIP: OnFailure
ON_FAILURE_UNSPECIFIED: OnFailure
RUN_STATUS_CANCELLED: RunStatus
RUN_STATUS_COMPLETED: RunStatus
RUN_STATUS_FAILED: RunStatus
RUN_STATUS_RUNNING: RunStatus
RUN_STATUS_UNSPECIFIED: RunStatus

class Attempt(_message.Message):
    __slots__ = ["attempt", "end_time", "error", "iteration", "name", "start_time", "status", "task_id", "work_item_id", "worker"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    WORK_ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    end_time: int
    error: str
    iteration: int
    name: str
    start_time: int
    status: AttemptStatus
    task_id: str
    work_item_id: str
    worker: str
    def __init__(self, task_id: _Optional[str] = ..., name: _Optional[str] = ..., status: _Optional[_Union[AttemptStatus, str]] = ..., work_item_id: _Optional[str] = ..., worker: _Optional[str] = ..., start_time: _Optional[int] = ..., end_time: _Optional[int] = ..., error: _Optional[str] = ..., iteration: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ["reason", "run_id", "tenant_key"]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    reason: str
    run_id: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ["run"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class DagOpsServiceGetRunRequest(_message.Message):
    __slots__ = ["run_id", "tenant_key"]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class DagOpsServiceGetRunResponse(_message.Message):
    __slots__ = ["run"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class Definition(_message.Message):
    __slots__ = ["affinity", "id", "nodes"]
    AFFINITY_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    affinity: Affinity
    id: str
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, id: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., affinity: _Optional[_Union[Affinity, str]] = ...) -> None: ...

class GetDefinitionRequest(_message.Message):
    __slots__ = ["definition_id", "tenant_key"]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    definition_id: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., definition_id: _Optional[str] = ...) -> None: ...

class GetDefinitionResponse(_message.Message):
    __slots__ = ["definition", "stored"]
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    definition: Definition
    stored: StoredDefinition
    def __init__(self, definition: _Optional[_Union[Definition, _Mapping]] = ..., stored: _Optional[_Union[StoredDefinition, _Mapping]] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ["run_id", "tenant_key"]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ["run"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class ListDefinitionsRequest(_message.Message):
    __slots__ = ["page_size", "page_token", "tenant_key"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListDefinitionsResponse(_message.Message):
    __slots__ = ["definitions", "next_page_token"]
    DEFINITIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    definitions: _containers.RepeatedCompositeFieldContainer[StoredDefinition]
    next_page_token: str
    def __init__(self, definitions: _Optional[_Iterable[_Union[StoredDefinition, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ["definition_id", "page_size", "page_token", "statuses", "tenant_key"]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    definition_id: str
    page_size: int
    page_token: str
    statuses: _containers.RepeatedScalarFieldContainer[RunStatus]
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., statuses: _Optional[_Iterable[_Union[RunStatus, str]]] = ..., definition_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ["next_page_token", "runs"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    def __init__(self, runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ["depends_on", "engine_kind", "event", "fan_out", "kind", "max_retries", "name", "on_failure", "payload_json", "priority", "timeout", "worker_params"]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    FAN_OUT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ON_FAILURE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    WORKER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    depends_on: _containers.RepeatedScalarFieldContainer[str]
    engine_kind: str
    event: str
    fan_out: str
    kind: NodeKind
    max_retries: int
    name: str
    on_failure: OnFailure
    payload_json: str
    priority: int
    timeout: _duration_pb2.Duration
    worker_params: _work_item_pb2.WorkerParams
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[NodeKind, str]] = ..., engine_kind: _Optional[str] = ..., payload_json: _Optional[str] = ..., depends_on: _Optional[_Iterable[str]] = ..., max_retries: _Optional[int] = ..., worker_params: _Optional[_Union[_work_item_pb2.WorkerParams, _Mapping]] = ..., timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., fan_out: _Optional[str] = ..., on_failure: _Optional[_Union[OnFailure, str]] = ..., priority: _Optional[int] = ..., event: _Optional[str] = ...) -> None: ...

class NodeState(_message.Message):
    __slots__ = ["attempts", "depends_on", "error", "iterations", "iterations_done", "name", "status"]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_DONE_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    attempts: _containers.RepeatedCompositeFieldContainer[Attempt]
    depends_on: _containers.RepeatedScalarFieldContainer[str]
    error: str
    iterations: int
    iterations_done: int
    name: str
    status: NodeStatus
    def __init__(self, name: _Optional[str] = ..., status: _Optional[_Union[NodeStatus, str]] = ..., attempts: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ..., iterations: _Optional[int] = ..., iterations_done: _Optional[int] = ..., error: _Optional[str] = ..., depends_on: _Optional[_Iterable[str]] = ...) -> None: ...

class PutDefinitionRequest(_message.Message):
    __slots__ = ["definition", "tenant_key"]
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    definition: Definition
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., definition: _Optional[_Union[Definition, _Mapping]] = ...) -> None: ...

class PutDefinitionResponse(_message.Message):
    __slots__ = ["created", "definition_id"]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    created: bool
    definition_id: str
    def __init__(self, definition_id: _Optional[str] = ..., created: bool = ...) -> None: ...

class ResumeRunRequest(_message.Message):
    __slots__ = ["run_id", "tenant_key"]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class ResumeRunResponse(_message.Message):
    __slots__ = ["run"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ["context_json", "created_by", "created_on", "definition_id", "duration", "end_time", "id", "nodes", "reason", "run_id", "start_time", "status", "tenant_key"]
    CONTEXT_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_ON_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    context_json: str
    created_by: str
    created_on: _timestamp_pb2.Timestamp
    definition_id: str
    duration: int
    end_time: int
    id: str
    nodes: _containers.RepeatedCompositeFieldContainer[NodeState]
    reason: str
    run_id: str
    start_time: int
    status: RunStatus
    tenant_key: str
    def __init__(self, id: _Optional[str] = ..., tenant_key: _Optional[str] = ..., definition_id: _Optional[str] = ..., status: _Optional[_Union[RunStatus, str]] = ..., context_json: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeState, _Mapping]]] = ..., start_time: _Optional[int] = ..., end_time: _Optional[int] = ..., duration: _Optional[int] = ..., created_by: _Optional[str] = ..., created_on: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class SignalRunRequest(_message.Message):
    __slots__ = ["event", "payload_json", "run_id", "tenant_key"]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    event: str
    payload_json: str
    run_id: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., run_id: _Optional[str] = ..., event: _Optional[str] = ..., payload_json: _Optional[str] = ...) -> None: ...

class SignalRunResponse(_message.Message):
    __slots__ = ["delivered", "run"]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    delivered: bool
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ..., delivered: bool = ...) -> None: ...

class StartRunRequest(_message.Message):
    __slots__ = ["context_json", "definition", "definition_id", "idempotency_key", "tenant_key"]
    CONTEXT_JSON_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    context_json: str
    definition: Definition
    definition_id: str
    idempotency_key: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., definition: _Optional[_Union[Definition, _Mapping]] = ..., definition_id: _Optional[str] = ..., context_json: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class StartRunResponse(_message.Message):
    __slots__ = ["existing", "run"]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    existing: bool
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ..., existing: bool = ...) -> None: ...

class StoredDefinition(_message.Message):
    __slots__ = ["created_by", "created_on", "definition_id", "updated_by", "updated_on"]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_ON_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATED_BY_FIELD_NUMBER: _ClassVar[int]
    UPDATED_ON_FIELD_NUMBER: _ClassVar[int]
    created_by: str
    created_on: _timestamp_pb2.Timestamp
    definition_id: str
    updated_by: str
    updated_on: _timestamp_pb2.Timestamp
    def __init__(self, definition_id: _Optional[str] = ..., created_by: _Optional[str] = ..., created_on: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., updated_by: _Optional[str] = ..., updated_on: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WatchRunRequest(_message.Message):
    __slots__ = ["run_id", "tenant_key", "with_attempts"]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    WITH_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant_key: str
    with_attempts: bool
    def __init__(self, tenant_key: _Optional[str] = ..., run_id: _Optional[str] = ..., with_attempts: bool = ...) -> None: ...

class WatchRunResponse(_message.Message):
    __slots__ = ["run"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class Affinity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class NodeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class OnFailure(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class RunStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class NodeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class AttemptStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
