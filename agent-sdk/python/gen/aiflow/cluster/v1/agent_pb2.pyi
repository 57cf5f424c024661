from aiflow.cluster.v1 import common_pb2 as _common_pb2
from aiflow.cluster.v1 import work_item_pb2 as _work_item_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

AGENT_TYPE_LOCAL: AgentType
AGENT_TYPE_REMOTE: AgentType
AGENT_TYPE_UNSPECIFIED: AgentType
DESCRIPTOR: _descriptor.FileDescriptor

class AgentCapacity(_message.Message):
    __slots__ = ["cpu_millis", "disks", "gpus", "memory_mb"]
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    DISKS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    cpu_millis: int
    disks: _containers.RepeatedCompositeFieldContainer[DiskCapacity]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuCapacity]
    memory_mb: int
    def __init__(self, cpu_millis: _Optional[int] = ..., memory_mb: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[GpuCapacity, _Mapping]]] = ..., disks: _Optional[_Iterable[_Union[DiskCapacity, _Mapping]]] = ...) -> None: ...

class AgentMetadata(_message.Message):
    __slots__ = ["capacity", "engine_kinds", "models", "slots", "tags", "tenants"]
    class TagsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ENGINE_KINDS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    capacity: AgentCapacity
    engine_kinds: _containers.RepeatedScalarFieldContainer[str]
    models: _containers.RepeatedScalarFieldContainer[str]
    slots: int
    tags: _containers.ScalarMap[str, str]
    tenants: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tags: _Optional[_Mapping[str, str]] = ..., slots: _Optional[int] = ..., tenants: _Optional[_Iterable[str]] = ..., engine_kinds: _Optional[_Iterable[str]] = ..., models: _Optional[_Iterable[str]] = ..., capacity: _Optional[_Union[AgentCapacity, _Mapping]] = ...) -> None: ...

class AgentMetrics(_message.Message):
    __slots__ = ["cpu_utilization", "disks", "gpus", "memory_total_bytes", "memory_used_bytes"]
    CPU_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    DISKS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    cpu_utilization: float
    disks: _containers.RepeatedCompositeFieldContainer[DiskMetrics]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuMetrics]
    memory_total_bytes: int
    memory_used_bytes: int
    def __init__(self, cpu_utilization: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., disks: _Optional[_Iterable[_Union[DiskMetrics, _Mapping]]] = ..., gpus: _Optional[_Iterable[_Union[GpuMetrics, _Mapping]]] = ...) -> None: ...

class CancelDirective(_message.Message):
    __slots__ = ["lease_token", "reason", "work_item_id"]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WORK_ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    lease_token: str
    reason: str
    work_item_id: str
    def __init__(self, work_item_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ClaimRequest(_message.Message):
    __slots__ = ["completions", "max_items", "name", "wait", "wait_with_completions"]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_ITEMS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    WAIT_WITH_COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    max_items: int
    name: str
    wait: _duration_pb2.Duration
    wait_with_completions: bool
    def __init__(self, name: _Optional[str] = ..., max_items: _Optional[int] = ..., wait: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ..., wait_with_completions: bool = ...) -> None: ...

class ClaimResponse(_message.Message):
    __slots__ = ["affinity_keys", "completion_outcomes", "items", "status"]
    AFFINITY_KEYS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    affinity_keys: _containers.RepeatedScalarFieldContainer[str]
    completion_outcomes: _containers.RepeatedCompositeFieldContainer[_work_item_pb2.ItemOutcome]
    items: _containers.RepeatedCompositeFieldContainer[_work_item_pb2.WorkItem]
    status: _common_pb2.AgentStatus
    def __init__(self, items: _Optional[_Iterable[_Union[_work_item_pb2.WorkItem, _Mapping]]] = ..., status: _Optional[_Union[_common_pb2.AgentStatus, str]] = ..., affinity_keys: _Optional[_Iterable[str]] = ..., completion_outcomes: _Optional[_Iterable[_Union[_work_item_pb2.ItemOutcome, _Mapping]]] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ["items", "name"]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Completion]
    name: str
    def __init__(self, name: _Optional[str] = ..., items: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ["outcomes"]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[_work_item_pb2.ItemOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[_work_item_pb2.ItemOutcome, _Mapping]]] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ["lease_token", "result_json", "work_item_id"]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    WORK_ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    lease_token: str
    result_json: str
    work_item_id: str
    def __init__(self, work_item_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., result_json: _Optional[str] = ...) -> None: ...

class ConnectRequest(_message.Message):
    __slots__ = ["completions", "credits", "extensions", "failures", "goodbye", "heartbeat", "name", "releases", "withdraw_credits"]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    EXTENSIONS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    GOODBYE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    WITHDRAW_CREDITS_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    credits: int
    extensions: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    failures: _containers.RepeatedCompositeFieldContainer[Failure]
    goodbye: bool
    heartbeat: HeartbeatRequest
    name: str
    releases: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    withdraw_credits: bool
    def __init__(self, name: _Optional[str] = ..., credits: _Optional[int] = ..., completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ..., failures: _Optional[_Iterable[_Union[Failure, _Mapping]]] = ..., releases: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ..., extensions: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ..., heartbeat: _Optional[_Union[HeartbeatRequest, _Mapping]] = ..., goodbye: bool = ..., withdraw_credits: bool = ...) -> None: ...

class ConnectResponse(_message.Message):
    __slots__ = ["affinity_keys", "completion_outcomes", "credits_withdrawn", "directives", "extend_outcomes", "failure_outcomes", "items", "lease_expires_at_ns", "refused", "release_outcomes", "status"]
    AFFINITY_KEYS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    CREDITS_WITHDRAWN_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVES_FIELD_NUMBER: _ClassVar[int]
    EXTEND_OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    FAILURE_OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_NS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    RELEASE_OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    affinity_keys: _containers.RepeatedScalarFieldContainer[str]
    completion_outcomes: _containers.RepeatedCompositeFieldContainer[_work_item_pb2.ItemOutcome]
    credits_withdrawn: bool
    directives: _containers.RepeatedCompositeFieldContainer[Directive]
    extend_outcomes: _containers.RepeatedCompositeFieldContainer[_work_item_pb2.ItemOutcome]
    failure_outcomes: _containers.RepeatedCompositeFieldContainer[_work_item_pb2.ItemOutcome]
    items: _containers.RepeatedCompositeFieldContainer[_work_item_pb2.WorkItem]
    lease_expires_at_ns: int
    refused: str
    release_outcomes: _containers.RepeatedCompositeFieldContainer[_work_item_pb2.ItemOutcome]
    status: _common_pb2.AgentStatus
    def __init__(self, items: _Optional[_Iterable[_Union[_work_item_pb2.WorkItem, _Mapping]]] = ..., affinity_keys: _Optional[_Iterable[str]] = ..., status: _Optional[_Union[_common_pb2.AgentStatus, str]] = ..., directives: _Optional[_Iterable[_Union[Directive, _Mapping]]] = ..., completion_outcomes: _Optional[_Iterable[_Union[_work_item_pb2.ItemOutcome, _Mapping]]] = ..., failure_outcomes: _Optional[_Iterable[_Union[_work_item_pb2.ItemOutcome, _Mapping]]] = ..., release_outcomes: _Optional[_Iterable[_Union[_work_item_pb2.ItemOutcome, _Mapping]]] = ..., extend_outcomes: _Optional[_Iterable[_Union[_work_item_pb2.ItemOutcome, _Mapping]]] = ..., lease_expires_at_ns: _Optional[int] = ..., refused: _Optional[str] = ..., credits_withdrawn: bool = ...) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeregisterResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class Directive(_message.Message):
    __slots__ = ["cancel", "status"]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    cancel: CancelDirective
    status: StatusDirective
    def __init__(self, status: _Optional[_Union[StatusDirective, _Mapping]] = ..., cancel: _Optional[_Union[CancelDirective, _Mapping]] = ...) -> None: ...

class DiskCapacity(_message.Message):
    __slots__ = ["mount", "size_mb"]
    MOUNT_FIELD_NUMBER: _ClassVar[int]
    SIZE_MB_FIELD_NUMBER: _ClassVar[int]
    mount: str
    size_mb: int
    def __init__(self, mount: _Optional[str] = ..., size_mb: _Optional[int] = ...) -> None: ...

class DiskMetrics(_message.Message):
    __slots__ = ["free_bytes", "mount", "total_bytes"]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MOUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    free_bytes: int
    mount: str
    total_bytes: int
    def __init__(self, mount: _Optional[str] = ..., free_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class ExtendLeaseRequest(_message.Message):
    __slots__ = ["leases", "name"]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    name: str
    def __init__(self, name: _Optional[str] = ..., leases: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ...) -> None: ...

class ExtendLeaseResponse(_message.Message):
    __slots__ = ["lease_expires_at_ns", "outcomes"]
    LEASE_EXPIRES_AT_NS_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    lease_expires_at_ns: int
    outcomes: _containers.RepeatedCompositeFieldContainer[_work_item_pb2.ItemOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[_work_item_pb2.ItemOutcome, _Mapping]]] = ..., lease_expires_at_ns: _Optional[int] = ...) -> None: ...

class FailRequest(_message.Message):
    __slots__ = ["items", "name"]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Failure]
    name: str
    def __init__(self, name: _Optional[str] = ..., items: _Optional[_Iterable[_Union[Failure, _Mapping]]] = ...) -> None: ...

class FailResponse(_message.Message):
    __slots__ = ["outcomes"]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[_work_item_pb2.ItemOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[_work_item_pb2.ItemOutcome, _Mapping]]] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ["error", "lease_token", "retry_delay", "retryable", "work_item_id"]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    RETRY_DELAY_FIELD_NUMBER: _ClassVar[int]
    WORK_ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    error: str
    lease_token: str
    retry_delay: _duration_pb2.Duration
    retryable: bool
    work_item_id: str
    def __init__(self, work_item_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., error: _Optional[str] = ..., retryable: bool = ..., retry_delay: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class GpuCapacity(_message.Message):
    __slots__ = ["index", "memory_mb", "model"]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    index: int
    memory_mb: int
    model: str
    def __init__(self, index: _Optional[int] = ..., model: _Optional[str] = ..., memory_mb: _Optional[int] = ...) -> None: ...

class GpuMetrics(_message.Message):
    __slots__ = ["index", "memory_total_bytes", "memory_used_bytes", "model", "utilization"]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    index: int
    memory_total_bytes: int
    memory_used_bytes: int
    model: str
    utilization: float
    def __init__(self, index: _Optional[int] = ..., model: _Optional[str] = ..., utilization: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ["in_flight", "metrics", "name"]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    in_flight: int
    metrics: AgentMetrics
    name: str
    def __init__(self, name: _Optional[str] = ..., metrics: _Optional[_Union[AgentMetrics, _Mapping]] = ..., in_flight: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ["directives", "status"]
    DIRECTIVES_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    directives: _containers.RepeatedCompositeFieldContainer[Directive]
    status: _common_pb2.AgentStatus
    def __init__(self, status: _Optional[_Union[_common_pb2.AgentStatus, str]] = ..., directives: _Optional[_Iterable[_Union[Directive, _Mapping]]] = ...) -> None: ...

class LeaseRef(_message.Message):
    __slots__ = ["drain_deadline", "lease_token", "work_item_id"]
    DRAIN_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WORK_ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    drain_deadline: bool
    lease_token: str
    work_item_id: str
    def __init__(self, work_item_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., drain_deadline: bool = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ["agent_type", "agent_version", "binary_path", "grpc_address", "http_address", "infra_address", "metadata", "name"]
    AGENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    BINARY_PATH_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INFRA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    agent_type: AgentType
    agent_version: str
    binary_path: str
    grpc_address: str
    http_address: str
    infra_address: str
    metadata: AgentMetadata
    name: str
    def __init__(self, name: _Optional[str] = ..., http_address: _Optional[str] = ..., grpc_address: _Optional[str] = ..., infra_address: _Optional[str] = ..., agent_version: _Optional[str] = ..., binary_path: _Optional[str] = ..., agent_type: _Optional[_Union[AgentType, str]] = ..., metadata: _Optional[_Union[AgentMetadata, _Mapping]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ["created", "heartbeat_interval", "id", "lease_ttl", "status"]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    created: bool
    heartbeat_interval: _duration_pb2.Duration
    id: str
    lease_ttl: _duration_pb2.Duration
    status: _common_pb2.AgentStatus
    def __init__(self, id: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.AgentStatus, str]] = ..., heartbeat_interval: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., lease_ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., created: bool = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ["leases", "name"]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    name: str
    def __init__(self, name: _Optional[str] = ..., leases: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ["outcomes"]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[_work_item_pb2.ItemOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[_work_item_pb2.ItemOutcome, _Mapping]]] = ...) -> None: ...

class StatusDirective(_message.Message):
    __slots__ = ["drain_deadline", "reason", "status"]
    DRAIN_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    drain_deadline: _timestamp_pb2.Timestamp
    reason: str
    status: _common_pb2.AgentStatus
    def __init__(self, status: _Optional[_Union[_common_pb2.AgentStatus, str]] = ..., reason: _Optional[str] = ..., drain_deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WatchDirectivesRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class WatchDirectivesResponse(_message.Message):
    __slots__ = ["directive"]
    DIRECTIVE_FIELD_NUMBER: _ClassVar[int]
    directive: Directive
    def __init__(self, directive: _Optional[_Union[Directive, _Mapping]] = ...) -> None: ...

class AgentType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
