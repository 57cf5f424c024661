from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

ACTION_SIGNAL: Action
ACTION_START: Action
ACTION_UNSPECIFIED: Action
DESCRIPTOR: _descriptor.FileDescriptor
TRIGGER_TYPE_CRON: TriggerType
TRIGGER_TYPE_UNSPECIFIED: TriggerType
TRIGGER_TYPE_WEBHOOK: TriggerType

class DeleteTriggerRequest(_message.Message):
    __slots__ = ["name", "tenant_key"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DeleteTriggerResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class GetTriggerRequest(_message.Message):
    __slots__ = ["name", "tenant_key"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class GetTriggerResponse(_message.Message):
    __slots__ = ["trigger"]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    trigger: Trigger
    def __init__(self, trigger: _Optional[_Union[Trigger, _Mapping]] = ...) -> None: ...

class ListTriggersRequest(_message.Message):
    __slots__ = ["tenant_key"]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ...) -> None: ...

class ListTriggersResponse(_message.Message):
    __slots__ = ["triggers"]
    TRIGGERS_FIELD_NUMBER: _ClassVar[int]
    triggers: _containers.RepeatedCompositeFieldContainer[Trigger]
    def __init__(self, triggers: _Optional[_Iterable[_Union[Trigger, _Mapping]]] = ...) -> None: ...

class PutTriggerRequest(_message.Message):
    __slots__ = ["tenant_key", "trigger"]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    tenant_key: str
    trigger: Trigger
    def __init__(self, tenant_key: _Optional[str] = ..., trigger: _Optional[_Union[Trigger, _Mapping]] = ...) -> None: ...

class PutTriggerResponse(_message.Message):
    __slots__ = ["created", "trigger"]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    created: bool
    trigger: Trigger
    def __init__(self, trigger: _Optional[_Union[Trigger, _Mapping]] = ..., created: bool = ...) -> None: ...

class Trigger(_message.Message):
    __slots__ = ["action", "created_on", "definition_id", "engine_kind", "event", "has_secret", "name", "next_fire", "owner", "run_id", "run_id_path", "schedule", "secret", "source", "time_zone", "type", "updated_on"]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_ON_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    HAS_SECRET_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIRE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_PATH_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TIME_ZONE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    UPDATED_ON_FIELD_NUMBER: _ClassVar[int]
    action: Action
    created_on: _timestamp_pb2.Timestamp
    definition_id: str
    engine_kind: str
    event: str
    has_secret: bool
    name: str
    next_fire: _timestamp_pb2.Timestamp
    owner: str
    run_id: str
    run_id_path: str
    schedule: str
    secret: str
    source: str
    time_zone: str
    type: TriggerType
    updated_on: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., type: _Optional[_Union[TriggerType, str]] = ..., action: _Optional[_Union[Action, str]] = ..., definition_id: _Optional[str] = ..., event: _Optional[str] = ..., run_id: _Optional[str] = ..., run_id_path: _Optional[str] = ..., schedule: _Optional[str] = ..., time_zone: _Optional[str] = ..., secret: _Optional[str] = ..., engine_kind: _Optional[str] = ..., has_secret: bool = ..., owner: _Optional[str] = ..., source: _Optional[str] = ..., next_fire: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., created_on: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., updated_on: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class TriggerType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
