from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
FIRING_ACTION_SIGNAL: FiringAction
FIRING_ACTION_START: FiringAction
FIRING_ACTION_UNSPECIFIED: FiringAction
FIRING_OUTCOME_FAILED: FiringOutcome
FIRING_OUTCOME_REFUSED: FiringOutcome
FIRING_OUTCOME_SIGNALLED: FiringOutcome
FIRING_OUTCOME_STARTED: FiringOutcome
FIRING_OUTCOME_UNSPECIFIED: FiringOutcome
RUN_STATE_ENDED: RunState
RUN_STATE_LIVE: RunState
RUN_STATE_UNSPECIFIED: RunState
TRIGGER_TYPE_CRON: TriggerType
TRIGGER_TYPE_FILESYSTEM: TriggerType
TRIGGER_TYPE_GITPOLL: TriggerType
TRIGGER_TYPE_UNSPECIFIED: TriggerType
TRIGGER_TYPE_WEBHOOK: TriggerType

class EngineRun(_message.Message):
    __slots__ = ["created_by", "created_on", "definition_id", "ended_on", "engine_kind", "id", "parent_run_id", "run_id", "tenant_key", "trigger_firing_id", "triggered_by", "updated_by", "updated_on"]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_ON_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    ENDED_ON_FIELD_NUMBER: _ClassVar[int]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    TRIGGERED_BY_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIRING_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATED_BY_FIELD_NUMBER: _ClassVar[int]
    UPDATED_ON_FIELD_NUMBER: _ClassVar[int]
    created_by: str
    created_on: _timestamp_pb2.Timestamp
    definition_id: str
    ended_on: int
    engine_kind: str
    id: str
    parent_run_id: str
    run_id: str
    tenant_key: str
    trigger_firing_id: str
    triggered_by: str
    updated_by: str
    updated_on: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., tenant_key: _Optional[str] = ..., run_id: _Optional[str] = ..., engine_kind: _Optional[str] = ..., definition_id: _Optional[str] = ..., parent_run_id: _Optional[str] = ..., triggered_by: _Optional[str] = ..., trigger_firing_id: _Optional[str] = ..., ended_on: _Optional[int] = ..., created_by: _Optional[str] = ..., created_on: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., updated_by: _Optional[str] = ..., updated_on: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetFiringRequest(_message.Message):
    __slots__ = ["id", "tenant_key"]
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class GetFiringResponse(_message.Message):
    __slots__ = ["firing"]
    FIRING_FIELD_NUMBER: _ClassVar[int]
    firing: TriggerFiring
    def __init__(self, firing: _Optional[_Union[TriggerFiring, _Mapping]] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ["run_id", "tenant_key"]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ["engine_table", "run"]
    ENGINE_TABLE_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    engine_table: str
    run: EngineRun
    def __init__(self, run: _Optional[_Union[EngineRun, _Mapping]] = ..., engine_table: _Optional[str] = ...) -> None: ...

class ListFiringsRequest(_message.Message):
    __slots__ = ["outcomes", "page_size", "page_token", "run_id", "tenant_key", "trigger_name"]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_NAME_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedScalarFieldContainer[FiringOutcome]
    page_size: int
    page_token: str
    run_id: str
    tenant_key: str
    trigger_name: str
    def __init__(self, tenant_key: _Optional[str] = ..., trigger_name: _Optional[str] = ..., run_id: _Optional[str] = ..., outcomes: _Optional[_Iterable[_Union[FiringOutcome, str]]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListFiringsResponse(_message.Message):
    __slots__ = ["firings", "next_page_token"]
    FIRINGS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    firings: _containers.RepeatedCompositeFieldContainer[TriggerFiring]
    next_page_token: str
    def __init__(self, firings: _Optional[_Iterable[_Union[TriggerFiring, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ["engine_kind", "page_size", "page_token", "parent_run_id", "state", "tenant_key", "triggered_by"]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    TRIGGERED_BY_FIELD_NUMBER: _ClassVar[int]
    engine_kind: str
    page_size: int
    page_token: str
    parent_run_id: str
    state: RunState
    tenant_key: str
    triggered_by: str
    def __init__(self, tenant_key: _Optional[str] = ..., engine_kind: _Optional[str] = ..., triggered_by: _Optional[str] = ..., parent_run_id: _Optional[str] = ..., state: _Optional[_Union[RunState, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ["next_page_token", "runs"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    runs: _containers.RepeatedCompositeFieldContainer[EngineRun]
    def __init__(self, runs: _Optional[_Iterable[_Union[EngineRun, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RecordFiringRequest(_message.Message):
    __slots__ = ["action", "definition_id", "error", "event", "fired_on", "outcome", "payload", "run_id", "tenant_key", "trigger_name", "trigger_type"]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    FIRED_ON_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_NAME_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_TYPE_FIELD_NUMBER: _ClassVar[int]
    action: FiringAction
    definition_id: str
    error: str
    event: str
    fired_on: int
    outcome: FiringOutcome
    payload: str
    run_id: str
    tenant_key: str
    trigger_name: str
    trigger_type: TriggerType
    def __init__(self, tenant_key: _Optional[str] = ..., trigger_name: _Optional[str] = ..., trigger_type: _Optional[_Union[TriggerType, str]] = ..., payload: _Optional[str] = ..., action: _Optional[_Union[FiringAction, str]] = ..., definition_id: _Optional[str] = ..., event: _Optional[str] = ..., run_id: _Optional[str] = ..., outcome: _Optional[_Union[FiringOutcome, str]] = ..., error: _Optional[str] = ..., fired_on: _Optional[int] = ...) -> None: ...

class RecordFiringResponse(_message.Message):
    __slots__ = ["firing"]
    FIRING_FIELD_NUMBER: _ClassVar[int]
    firing: TriggerFiring
    def __init__(self, firing: _Optional[_Union[TriggerFiring, _Mapping]] = ...) -> None: ...

class RecordRunRequest(_message.Message):
    __slots__ = ["definition_id", "ended_on", "engine_kind", "parent_run_id", "run_id", "tenant_key", "trigger_firing_id", "triggered_by"]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    ENDED_ON_FIELD_NUMBER: _ClassVar[int]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    TRIGGERED_BY_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIRING_ID_FIELD_NUMBER: _ClassVar[int]
    definition_id: str
    ended_on: int
    engine_kind: str
    parent_run_id: str
    run_id: str
    tenant_key: str
    trigger_firing_id: str
    triggered_by: str
    def __init__(self, tenant_key: _Optional[str] = ..., run_id: _Optional[str] = ..., engine_kind: _Optional[str] = ..., definition_id: _Optional[str] = ..., parent_run_id: _Optional[str] = ..., triggered_by: _Optional[str] = ..., trigger_firing_id: _Optional[str] = ..., ended_on: _Optional[int] = ...) -> None: ...

class RecordRunResponse(_message.Message):
    __slots__ = ["created", "run"]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    created: bool
    run: EngineRun
    def __init__(self, run: _Optional[_Union[EngineRun, _Mapping]] = ..., created: bool = ...) -> None: ...

class TriggerFiring(_message.Message):
    __slots__ = ["action", "created_by", "created_on", "definition_id", "error", "event", "fired_on", "id", "outcome", "payload", "run_id", "tenant_key", "trigger_name", "trigger_type"]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_ON_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    FIRED_ON_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_NAME_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_TYPE_FIELD_NUMBER: _ClassVar[int]
    action: FiringAction
    created_by: str
    created_on: _timestamp_pb2.Timestamp
    definition_id: str
    error: str
    event: str
    fired_on: int
    id: str
    outcome: FiringOutcome
    payload: str
    run_id: str
    tenant_key: str
    trigger_name: str
    trigger_type: TriggerType
    def __init__(self, id: _Optional[str] = ..., tenant_key: _Optional[str] = ..., trigger_name: _Optional[str] = ..., trigger_type: _Optional[_Union[TriggerType, str]] = ..., payload: _Optional[str] = ..., action: _Optional[_Union[FiringAction, str]] = ..., definition_id: _Optional[str] = ..., event: _Optional[str] = ..., run_id: _Optional[str] = ..., outcome: _Optional[_Union[FiringOutcome, str]] = ..., error: _Optional[str] = ..., fired_on: _Optional[int] = ..., created_by: _Optional[str] = ..., created_on: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class TriggerType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class FiringAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class FiringOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
