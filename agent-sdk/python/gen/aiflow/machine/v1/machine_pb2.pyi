from aiflow.cluster.v1 import work_item_pb2 as _work_item_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Action(_message.Message):
    __slots__ = ["engine_kind", "max_retries", "payload_json", "priority", "worker_params"]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    WORKER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    engine_kind: str
    max_retries: int
    payload_json: str
    priority: int
    worker_params: _work_item_pb2.WorkerParams
    def __init__(self, engine_kind: _Optional[str] = ..., payload_json: _Optional[str] = ..., max_retries: _Optional[int] = ..., worker_params: _Optional[_Union[_work_item_pb2.WorkerParams, _Mapping]] = ..., priority: _Optional[int] = ...) -> None: ...

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
    __slots__ = ["id", "initial", "states"]
    ID_FIELD_NUMBER: _ClassVar[int]
    INITIAL_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    id: str
    initial: str
    states: _containers.RepeatedCompositeFieldContainer[State]
    def __init__(self, id: _Optional[str] = ..., initial: _Optional[str] = ..., states: _Optional[_Iterable[_Union[State, _Mapping]]] = ...) -> None: ...

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
    __slots__ = ["context_json", "created_by", "created_on", "definition_id", "failure", "history", "history_dropped", "live", "pending_event", "pending_to", "reason", "run_id", "state", "suspended", "tenant_key", "work_item_id"]
    CONTEXT_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_ON_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_DROPPED_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    PENDING_EVENT_FIELD_NUMBER: _ClassVar[int]
    PENDING_TO_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    WORK_ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    context_json: str
    created_by: str
    created_on: _timestamp_pb2.Timestamp
    definition_id: str
    failure: str
    history: _containers.RepeatedScalarFieldContainer[str]
    history_dropped: int
    live: bool
    pending_event: str
    pending_to: str
    reason: str
    run_id: str
    state: str
    suspended: bool
    tenant_key: str
    work_item_id: str
    def __init__(self, run_id: _Optional[str] = ..., tenant_key: _Optional[str] = ..., definition_id: _Optional[str] = ..., state: _Optional[str] = ..., context_json: _Optional[str] = ..., history: _Optional[_Iterable[str]] = ..., live: bool = ..., suspended: bool = ..., failure: _Optional[str] = ..., reason: _Optional[str] = ..., pending_event: _Optional[str] = ..., pending_to: _Optional[str] = ..., work_item_id: _Optional[str] = ..., created_by: _Optional[str] = ..., created_on: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., history_dropped: _Optional[int] = ...) -> None: ...

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
    __slots__ = ["action_started", "run", "to"]
    ACTION_STARTED_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    action_started: bool
    run: Run
    to: str
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ..., to: _Optional[str] = ..., action_started: bool = ...) -> None: ...

class StartRunRequest(_message.Message):
    __slots__ = ["context_json", "definition", "definition_id", "tenant_key"]
    CONTEXT_JSON_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    context_json: str
    definition: Definition
    definition_id: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., definition: _Optional[_Union[Definition, _Mapping]] = ..., definition_id: _Optional[str] = ..., context_json: _Optional[str] = ...) -> None: ...

class StartRunResponse(_message.Message):
    __slots__ = ["run"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class State(_message.Message):
    __slots__ = ["name", "terminal", "transitions"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_FIELD_NUMBER: _ClassVar[int]
    TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    terminal: bool
    transitions: _containers.RepeatedCompositeFieldContainer[Transition]
    def __init__(self, name: _Optional[str] = ..., terminal: bool = ..., transitions: _Optional[_Iterable[_Union[Transition, _Mapping]]] = ...) -> None: ...

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

class Transition(_message.Message):
    __slots__ = ["action", "event", "guard", "to"]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    action: Action
    event: str
    guard: str
    to: str
    def __init__(self, event: _Optional[str] = ..., to: _Optional[str] = ..., guard: _Optional[str] = ..., action: _Optional[_Union[Action, _Mapping]] = ...) -> None: ...

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
