from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

AGENT_STATUS_ACTIVE: AgentStatus
AGENT_STATUS_DRAINING: AgentStatus
AGENT_STATUS_INACTIVE: AgentStatus
AGENT_STATUS_UNSPECIFIED: AgentStatus
DESCRIPTOR: _descriptor.FileDescriptor

class AgentStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
