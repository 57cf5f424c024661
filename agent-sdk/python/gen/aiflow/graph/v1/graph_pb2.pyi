from aiflow.cluster.v1 import work_item_pb2 as _work_item_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
NODE_KIND_END: NodeKind
NODE_KIND_TASK: NodeKind
NODE_KIND_UNSPECIFIED: NodeKind
RUN_STATUS_CANCELLED: RunStatus
RUN_STATUS_COMPLETED: RunStatus
RUN_STATUS_FAILED: RunStatus
RUN_STATUS_RUNNING: RunStatus
RUN_STATUS_STOPPED: RunStatus
RUN_STATUS_UNSPECIFIED: RunStatus

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

class Definition(_message.Message):
    __slots__ = ["edges", "id", "max_steps", "nodes", "start"]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    edges: _containers.RepeatedCompositeFieldContainer[Edge]
    id: str
    max_steps: int
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    start: str
    def __init__(self, id: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., edges: _Optional[_Iterable[_Union[Edge, _Mapping]]] = ..., start: _Optional[str] = ..., max_steps: _Optional[int] = ...) -> None: ...

class Edge(_message.Message):
    __slots__ = ["to", "when"]
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    WHEN_FIELD_NUMBER: _ClassVar[int]
    to: str
    when: str
    def __init__(self, to: _Optional[str] = ..., when: _Optional[str] = ..., **kwargs) -> None: ...

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
    __slots__ = ["page_size", "page_token", "tenant_key"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ["next_page_token", "runs"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    def __init__(self, runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ["engine_kind", "kind", "max_retries", "max_visits", "name", "payload_json", "priority", "worker_params"]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    MAX_VISITS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    WORKER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    engine_kind: str
    kind: NodeKind
    max_retries: int
    max_visits: int
    name: str
    payload_json: str
    priority: int
    worker_params: _work_item_pb2.WorkerParams
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[NodeKind, str]] = ..., engine_kind: _Optional[str] = ..., payload_json: _Optional[str] = ..., max_retries: _Optional[int] = ..., worker_params: _Optional[_Union[_work_item_pb2.WorkerParams, _Mapping]] = ..., priority: _Optional[int] = ..., max_visits: _Optional[int] = ...) -> None: ...

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

class Run(_message.Message):
    __slots__ = ["created_by", "created_on", "definition_id", "error", "path", "path_dropped", "reason", "run_counts", "run_id", "state_json", "status", "steps", "task", "tenant_key", "work_item_id"]
    class RunCountsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_ON_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PATH_DROPPED_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUN_COUNTS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    WORK_ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    created_by: str
    created_on: _timestamp_pb2.Timestamp
    definition_id: str
    error: str
    path: _containers.RepeatedScalarFieldContainer[str]
    path_dropped: int
    reason: str
    run_counts: _containers.ScalarMap[str, int]
    run_id: str
    state_json: str
    status: RunStatus
    steps: int
    task: str
    tenant_key: str
    work_item_id: str
    def __init__(self, run_id: _Optional[str] = ..., tenant_key: _Optional[str] = ..., definition_id: _Optional[str] = ..., status: _Optional[_Union[RunStatus, str]] = ..., task: _Optional[str] = ..., steps: _Optional[int] = ..., path: _Optional[_Iterable[str]] = ..., run_counts: _Optional[_Mapping[str, int]] = ..., state_json: _Optional[str] = ..., reason: _Optional[str] = ..., error: _Optional[str] = ..., work_item_id: _Optional[str] = ..., created_by: _Optional[str] = ..., created_on: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., path_dropped: _Optional[int] = ...) -> None: ...

class StartRunRequest(_message.Message):
    __slots__ = ["definition", "definition_id", "state_json", "tenant_key"]
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    definition: Definition
    definition_id: str
    state_json: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., definition: _Optional[_Union[Definition, _Mapping]] = ..., definition_id: _Optional[str] = ..., state_json: _Optional[str] = ...) -> None: ...

class StartRunResponse(_message.Message):
    __slots__ = ["run"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

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
    __slots__ = ["run_id", "tenant_key"]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class WatchRunResponse(_message.Message):
    __slots__ = ["run"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class NodeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class RunStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
