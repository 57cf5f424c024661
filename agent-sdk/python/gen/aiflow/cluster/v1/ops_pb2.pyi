from aiflow.cluster.v1 import agent_pb2 as _agent_pb2
from aiflow.cluster.v1 import common_pb2 as _common_pb2
from aiflow.cluster.v1 import work_item_pb2 as _work_item_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentSelector(_message.Message):
    __slots__ = ["tags", "version_below"]
    class TagsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TAGS_FIELD_NUMBER: _ClassVar[int]
    VERSION_BELOW_FIELD_NUMBER: _ClassVar[int]
    tags: _containers.ScalarMap[str, str]
    version_below: str
    def __init__(self, tags: _Optional[_Mapping[str, str]] = ..., version_below: _Optional[str] = ...) -> None: ...

class AgentSummary(_message.Message):
    __slots__ = ["agent_type", "agent_version", "created_on", "drain", "grpc_address", "http_address", "id", "in_flight", "infra_address", "last_seen_age", "metadata", "metrics", "name", "status"]
    AGENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_ON_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    INFRA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_AGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    agent_type: _agent_pb2.AgentType
    agent_version: str
    created_on: _timestamp_pb2.Timestamp
    drain: DrainProgress
    grpc_address: str
    http_address: str
    id: str
    in_flight: int
    infra_address: str
    last_seen_age: _duration_pb2.Duration
    metadata: _agent_pb2.AgentMetadata
    metrics: _struct_pb2.Struct
    name: str
    status: _common_pb2.AgentStatus
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.AgentStatus, str]] = ..., agent_version: _Optional[str] = ..., agent_type: _Optional[_Union[_agent_pb2.AgentType, str]] = ..., metadata: _Optional[_Union[_agent_pb2.AgentMetadata, _Mapping]] = ..., metrics: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., last_seen_age: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., in_flight: _Optional[int] = ..., drain: _Optional[_Union[DrainProgress, _Mapping]] = ..., http_address: _Optional[str] = ..., grpc_address: _Optional[str] = ..., infra_address: _Optional[str] = ..., created_on: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Binding(_message.Message):
    __slots__ = ["affinity_key", "agent_id", "created_on", "id", "tenant_key", "updated_on"]
    AFFINITY_KEY_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_ON_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    UPDATED_ON_FIELD_NUMBER: _ClassVar[int]
    affinity_key: str
    agent_id: str
    created_on: _timestamp_pb2.Timestamp
    id: str
    tenant_key: str
    updated_on: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., affinity_key: _Optional[str] = ..., agent_id: _Optional[str] = ..., created_on: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., updated_on: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., tenant_key: _Optional[str] = ...) -> None: ...

class CancelItemsRequest(_message.Message):
    __slots__ = ["ids", "parent_ids", "reason", "run_id", "tenant_key"]
    IDS_FIELD_NUMBER: _ClassVar[int]
    PARENT_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    parent_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    run_id: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ..., run_id: _Optional[str] = ..., parent_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelItemsResponse(_message.Message):
    __slots__ = ["cancelled_ids"]
    CANCELLED_IDS_FIELD_NUMBER: _ClassVar[int]
    cancelled_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cancelled_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ConcurrencyKey(_message.Message):
    __slots__ = ["in_flight", "key", "limit", "limit_source", "pending", "tenant_key"]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    in_flight: int
    key: str
    limit: int
    limit_source: str
    pending: int
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., key: _Optional[str] = ..., limit: _Optional[int] = ..., limit_source: _Optional[str] = ..., in_flight: _Optional[int] = ..., pending: _Optional[int] = ...) -> None: ...

class ConcurrencyRule(_message.Message):
    __slots__ = ["key_prefix", "max_in_flight", "tenant_key"]
    KEY_PREFIX_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    key_prefix: str
    max_in_flight: int
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., key_prefix: _Optional[str] = ..., max_in_flight: _Optional[int] = ...) -> None: ...

class DrainAgentRequest(_message.Message):
    __slots__ = ["deadline", "dry_run", "name", "reason", "selector"]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    deadline: _duration_pb2.Duration
    dry_run: bool
    name: str
    reason: str
    selector: AgentSelector
    def __init__(self, name: _Optional[str] = ..., selector: _Optional[_Union[AgentSelector, _Mapping]] = ..., deadline: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., reason: _Optional[str] = ..., dry_run: bool = ...) -> None: ...

class DrainAgentResponse(_message.Message):
    __slots__ = ["agents", "version_not_comparable"]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    VERSION_NOT_COMPARABLE_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[AgentSummary]
    version_not_comparable: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, agents: _Optional[_Iterable[_Union[AgentSummary, _Mapping]]] = ..., version_not_comparable: _Optional[_Iterable[str]] = ...) -> None: ...

class DrainProgress(_message.Message):
    __slots__ = ["complete", "deadline", "in_flight_at_start", "in_flight_now", "reason", "released_at_deadline", "started_at"]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_AT_START_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_NOW_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RELEASED_AT_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    complete: bool
    deadline: _timestamp_pb2.Timestamp
    in_flight_at_start: int
    in_flight_now: int
    reason: str
    released_at_deadline: int
    started_at: _timestamp_pb2.Timestamp
    def __init__(self, reason: _Optional[str] = ..., started_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., in_flight_at_start: _Optional[int] = ..., in_flight_now: _Optional[int] = ..., complete: bool = ..., released_at_deadline: _Optional[int] = ...) -> None: ...

class GetAgentRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetAgentResponse(_message.Message):
    __slots__ = ["affinity_keys", "agent", "dispatched"]
    AFFINITY_KEYS_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_FIELD_NUMBER: _ClassVar[int]
    affinity_keys: _containers.RepeatedScalarFieldContainer[str]
    agent: AgentSummary
    dispatched: _containers.RepeatedCompositeFieldContainer[_work_item_pb2.WorkItem]
    def __init__(self, agent: _Optional[_Union[AgentSummary, _Mapping]] = ..., dispatched: _Optional[_Iterable[_Union[_work_item_pb2.WorkItem, _Mapping]]] = ..., affinity_keys: _Optional[_Iterable[str]] = ...) -> None: ...

class ListAgentsRequest(_message.Message):
    __slots__ = ["include_removed", "statuses", "tags", "version"]
    class TagsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    INCLUDE_REMOVED_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    include_removed: bool
    statuses: _containers.RepeatedScalarFieldContainer[_common_pb2.AgentStatus]
    tags: _containers.ScalarMap[str, str]
    version: str
    def __init__(self, statuses: _Optional[_Iterable[_Union[_common_pb2.AgentStatus, str]]] = ..., tags: _Optional[_Mapping[str, str]] = ..., version: _Optional[str] = ..., include_removed: bool = ...) -> None: ...

class ListAgentsResponse(_message.Message):
    __slots__ = ["agents"]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[AgentSummary]
    def __init__(self, agents: _Optional[_Iterable[_Union[AgentSummary, _Mapping]]] = ...) -> None: ...

class ListBindingsRequest(_message.Message):
    __slots__ = ["agent_id", "key_prefix", "page_size", "page_token", "tenant_key"]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_PREFIX_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    key_prefix: str
    page_size: int
    page_token: str
    tenant_key: str
    def __init__(self, key_prefix: _Optional[str] = ..., agent_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., tenant_key: _Optional[str] = ...) -> None: ...

class ListBindingsResponse(_message.Message):
    __slots__ = ["bindings", "next_page_token"]
    BINDINGS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    bindings: _containers.RepeatedCompositeFieldContainer[Binding]
    next_page_token: str
    def __init__(self, bindings: _Optional[_Iterable[_Union[Binding, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListConcurrencyKeysRequest(_message.Message):
    __slots__ = ["key_prefix", "page_size", "page_token", "tenant_key"]
    KEY_PREFIX_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    key_prefix: str
    page_size: int
    page_token: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., key_prefix: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListConcurrencyKeysResponse(_message.Message):
    __slots__ = ["keys", "next_page_token", "rules"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[ConcurrencyKey]
    next_page_token: str
    rules: _containers.RepeatedCompositeFieldContainer[ConcurrencyRule]
    def __init__(self, keys: _Optional[_Iterable[_Union[ConcurrencyKey, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., rules: _Optional[_Iterable[_Union[ConcurrencyRule, _Mapping]]] = ...) -> None: ...

class ListRateLimitsRequest(_message.Message):
    __slots__ = ["key_prefix", "page_size", "page_token", "tenant_key"]
    KEY_PREFIX_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    key_prefix: str
    page_size: int
    page_token: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., key_prefix: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRateLimitsResponse(_message.Message):
    __slots__ = ["keys", "next_page_token", "rules"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[RateLimitKey]
    next_page_token: str
    rules: _containers.RepeatedCompositeFieldContainer[RateLimitRule]
    def __init__(self, rules: _Optional[_Iterable[_Union[RateLimitRule, _Mapping]]] = ..., keys: _Optional[_Iterable[_Union[RateLimitKey, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListTenantsRequest(_message.Message):
    __slots__ = ["tenant_key"]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ...) -> None: ...

class ListTenantsResponse(_message.Message):
    __slots__ = ["tenants"]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[Tenant]
    def __init__(self, tenants: _Optional[_Iterable[_Union[Tenant, _Mapping]]] = ...) -> None: ...

class OpsServiceGetItemRequest(_message.Message):
    __slots__ = ["id"]
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class OpsServiceGetItemResponse(_message.Message):
    __slots__ = ["children", "item"]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    children: _work_item_pb2.ChildCounts
    item: _work_item_pb2.WorkItem
    def __init__(self, item: _Optional[_Union[_work_item_pb2.WorkItem, _Mapping]] = ..., children: _Optional[_Union[_work_item_pb2.ChildCounts, _Mapping]] = ...) -> None: ...

class OpsServiceListItemsRequest(_message.Message):
    __slots__ = ["agent_id", "engine_kind", "idempotency_key", "page_size", "page_token", "parent_work_item_id", "run_id", "statuses", "tenant_key"]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PARENT_WORK_ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    engine_kind: str
    idempotency_key: str
    page_size: int
    page_token: str
    parent_work_item_id: str
    run_id: str
    statuses: _containers.RepeatedScalarFieldContainer[_work_item_pb2.WorkItemStatus]
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., statuses: _Optional[_Iterable[_Union[_work_item_pb2.WorkItemStatus, str]]] = ..., engine_kind: _Optional[str] = ..., run_id: _Optional[str] = ..., parent_work_item_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class OpsServiceListItemsResponse(_message.Message):
    __slots__ = ["items", "next_page_token"]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_work_item_pb2.WorkItem]
    next_page_token: str
    def __init__(self, items: _Optional[_Iterable[_Union[_work_item_pb2.WorkItem, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class QueueDepth(_message.Message):
    __slots__ = ["count", "engine_kind", "status", "tenant_key"]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    count: int
    engine_kind: str
    status: _work_item_pb2.WorkItemStatus
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., engine_kind: _Optional[str] = ..., status: _Optional[_Union[_work_item_pb2.WorkItemStatus, str]] = ..., count: _Optional[int] = ...) -> None: ...

class QueueStatsRequest(_message.Message):
    __slots__ = ["tenant_key"]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ...) -> None: ...

class QueueStatsResponse(_message.Message):
    __slots__ = ["completed_per_second", "dead_letters", "depth", "dispatch_wait_p50", "dispatch_wait_p99", "dispatched", "dispatched_per_second", "oldest_pending_age", "pending", "unplaceable", "unserved"]
    COMPLETED_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_WAIT_P50_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_WAIT_P99_FIELD_NUMBER: _ClassVar[int]
    OLDEST_PENDING_AGE_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    UNPLACEABLE_FIELD_NUMBER: _ClassVar[int]
    UNSERVED_FIELD_NUMBER: _ClassVar[int]
    completed_per_second: float
    dead_letters: int
    depth: _containers.RepeatedCompositeFieldContainer[QueueDepth]
    dispatch_wait_p50: _duration_pb2.Duration
    dispatch_wait_p99: _duration_pb2.Duration
    dispatched: int
    dispatched_per_second: float
    oldest_pending_age: _duration_pb2.Duration
    pending: int
    unplaceable: _containers.RepeatedCompositeFieldContainer[UnplaceableItems]
    unserved: _containers.RepeatedCompositeFieldContainer[UnservedItems]
    def __init__(self, depth: _Optional[_Iterable[_Union[QueueDepth, _Mapping]]] = ..., oldest_pending_age: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., dispatched_per_second: _Optional[float] = ..., completed_per_second: _Optional[float] = ..., dead_letters: _Optional[int] = ..., pending: _Optional[int] = ..., dispatched: _Optional[int] = ..., unplaceable: _Optional[_Iterable[_Union[UnplaceableItems, _Mapping]]] = ..., dispatch_wait_p50: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., dispatch_wait_p99: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., unserved: _Optional[_Iterable[_Union[UnservedItems, _Mapping]]] = ...) -> None: ...

class RateLimitKey(_message.Message):
    __slots__ = ["key", "limit", "next_slot_at", "tenant_key"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    NEXT_SLOT_AT_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    limit: RateLimitRule
    next_slot_at: _timestamp_pb2.Timestamp
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., key: _Optional[str] = ..., next_slot_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., limit: _Optional[_Union[RateLimitRule, _Mapping]] = ...) -> None: ...

class RateLimitRule(_message.Message):
    __slots__ = ["burst", "count", "interval", "key", "prefix", "tenant_key"]
    BURST_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    burst: int
    count: int
    interval: _duration_pb2.Duration
    key: str
    prefix: bool
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., key: _Optional[str] = ..., prefix: bool = ..., count: _Optional[int] = ..., interval: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., burst: _Optional[int] = ...) -> None: ...

class RebindRequest(_message.Message):
    __slots__ = ["affinity_key", "agent_id", "tenant_key"]
    AFFINITY_KEY_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    affinity_key: str
    agent_id: str
    tenant_key: str
    def __init__(self, affinity_key: _Optional[str] = ..., agent_id: _Optional[str] = ..., tenant_key: _Optional[str] = ...) -> None: ...

class RebindResponse(_message.Message):
    __slots__ = ["binding"]
    BINDING_FIELD_NUMBER: _ClassVar[int]
    binding: Binding
    def __init__(self, binding: _Optional[_Union[Binding, _Mapping]] = ...) -> None: ...

class RedriveItemsRequest(_message.Message):
    __slots__ = ["all", "ids", "run_id", "tenant_key"]
    ALL_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    all: bool
    ids: _containers.RepeatedScalarFieldContainer[str]
    run_id: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ..., run_id: _Optional[str] = ..., all: bool = ...) -> None: ...

class RedriveItemsResponse(_message.Message):
    __slots__ = ["redriven_ids"]
    REDRIVEN_IDS_FIELD_NUMBER: _ClassVar[int]
    redriven_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, redriven_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RemoveAgentRequest(_message.Message):
    __slots__ = ["force", "name"]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    force: bool
    name: str
    def __init__(self, name: _Optional[str] = ..., force: bool = ...) -> None: ...

class RemoveAgentResponse(_message.Message):
    __slots__ = ["released"]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class SetConcurrencyLimitRequest(_message.Message):
    __slots__ = ["key", "max_in_flight", "prefix", "tenant_key"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    max_in_flight: int
    prefix: bool
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., key: _Optional[str] = ..., prefix: bool = ..., max_in_flight: _Optional[int] = ...) -> None: ...

class SetConcurrencyLimitResponse(_message.Message):
    __slots__ = ["key"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: ConcurrencyKey
    def __init__(self, key: _Optional[_Union[ConcurrencyKey, _Mapping]] = ...) -> None: ...

class SetRateLimitRequest(_message.Message):
    __slots__ = ["burst", "clear", "count", "interval", "key", "prefix", "tenant_key"]
    BURST_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    burst: int
    clear: bool
    count: int
    interval: _duration_pb2.Duration
    key: str
    prefix: bool
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., key: _Optional[str] = ..., prefix: bool = ..., count: _Optional[int] = ..., interval: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., burst: _Optional[int] = ..., clear: bool = ...) -> None: ...

class SetRateLimitResponse(_message.Message):
    __slots__ = ["key", "rule"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    key: RateLimitKey
    rule: RateLimitRule
    def __init__(self, rule: _Optional[_Union[RateLimitRule, _Mapping]] = ..., key: _Optional[_Union[RateLimitKey, _Mapping]] = ...) -> None: ...

class SetTenantWeightRequest(_message.Message):
    __slots__ = ["clear", "tenant_key", "weight"]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    clear: bool
    tenant_key: str
    weight: float
    def __init__(self, tenant_key: _Optional[str] = ..., weight: _Optional[float] = ..., clear: bool = ...) -> None: ...

class SetTenantWeightResponse(_message.Message):
    __slots__ = ["tenant"]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class Tenant(_message.Message):
    __slots__ = ["dispatched", "pending", "tenant_key", "weight", "weight_source"]
    DISPATCHED_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_SOURCE_FIELD_NUMBER: _ClassVar[int]
    dispatched: int
    pending: int
    tenant_key: str
    weight: float
    weight_source: str
    def __init__(self, tenant_key: _Optional[str] = ..., weight: _Optional[float] = ..., weight_source: _Optional[str] = ..., pending: _Optional[int] = ..., dispatched: _Optional[int] = ...) -> None: ...

class UnbindRequest(_message.Message):
    __slots__ = ["affinity_key", "tenant_key"]
    AFFINITY_KEY_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    affinity_key: str
    tenant_key: str
    def __init__(self, affinity_key: _Optional[str] = ..., tenant_key: _Optional[str] = ...) -> None: ...

class UnbindResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class UndrainAgentRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UndrainAgentResponse(_message.Message):
    __slots__ = ["agent"]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    agent: AgentSummary
    def __init__(self, agent: _Optional[_Union[AgentSummary, _Mapping]] = ...) -> None: ...

class UnplaceableItems(_message.Message):
    __slots__ = ["count", "engine_kind", "oldest_age", "reason", "requirements", "tenant_key"]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    OLDEST_AGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUIREMENTS_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    count: int
    engine_kind: str
    oldest_age: _duration_pb2.Duration
    reason: str
    requirements: _work_item_pb2.Requirements
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., engine_kind: _Optional[str] = ..., requirements: _Optional[_Union[_work_item_pb2.Requirements, _Mapping]] = ..., count: _Optional[int] = ..., reason: _Optional[str] = ..., oldest_age: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class UnservedItems(_message.Message):
    __slots__ = ["agents_not_active", "count", "engine_kind", "oldest_age", "tenant_key"]
    AGENTS_NOT_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    OLDEST_AGE_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    agents_not_active: int
    count: int
    engine_kind: str
    oldest_age: _duration_pb2.Duration
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., engine_kind: _Optional[str] = ..., count: _Optional[int] = ..., oldest_age: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., agents_not_active: _Optional[int] = ...) -> None: ...
