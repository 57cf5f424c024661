from aiflow.cluster.v1 import work_item_pb2 as _work_item_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CancelRequest(_message.Message):
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

class CancelResponse(_message.Message):
    __slots__ = ["cancelled_ids"]
    CANCELLED_IDS_FIELD_NUMBER: _ClassVar[int]
    cancelled_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cancelled_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class EnqueueItem(_message.Message):
    __slots__ = ["engine_kind", "idempotency_key", "max_redeliveries", "max_retries", "not_before", "parent_work_item_id", "payload_json", "priority", "run_id", "task_id", "task_name", "worker_params"]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_REDELIVERIES_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    PARENT_WORK_ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_NAME_FIELD_NUMBER: _ClassVar[int]
    WORKER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    engine_kind: str
    idempotency_key: str
    max_redeliveries: int
    max_retries: int
    not_before: _timestamp_pb2.Timestamp
    parent_work_item_id: str
    payload_json: str
    priority: int
    run_id: str
    task_id: str
    task_name: str
    worker_params: _work_item_pb2.WorkerParams
    def __init__(self, engine_kind: _Optional[str] = ..., run_id: _Optional[str] = ..., task_id: _Optional[str] = ..., task_name: _Optional[str] = ..., worker_params: _Optional[_Union[_work_item_pb2.WorkerParams, _Mapping]] = ..., payload_json: _Optional[str] = ..., priority: _Optional[int] = ..., max_retries: _Optional[int] = ..., not_before: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., parent_work_item_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., max_redeliveries: _Optional[int] = ...) -> None: ...

class EnqueueRequest(_message.Message):
    __slots__ = ["engine_id", "items", "tenant_key"]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    items: _containers.RepeatedCompositeFieldContainer[EnqueueItem]
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., engine_id: _Optional[str] = ..., items: _Optional[_Iterable[_Union[EnqueueItem, _Mapping]]] = ...) -> None: ...

class EnqueueResponse(_message.Message):
    __slots__ = ["results"]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[EnqueueResult]
    def __init__(self, results: _Optional[_Iterable[_Union[EnqueueResult, _Mapping]]] = ...) -> None: ...

class EnqueueResult(_message.Message):
    __slots__ = ["existing", "id"]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    existing: bool
    id: str
    def __init__(self, id: _Optional[str] = ..., existing: bool = ...) -> None: ...

class GetItemRequest(_message.Message):
    __slots__ = ["id", "tenant_key"]
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class GetItemResponse(_message.Message):
    __slots__ = ["children", "item"]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    children: _work_item_pb2.ChildCounts
    item: _work_item_pb2.WorkItem
    def __init__(self, item: _Optional[_Union[_work_item_pb2.WorkItem, _Mapping]] = ..., children: _Optional[_Union[_work_item_pb2.ChildCounts, _Mapping]] = ...) -> None: ...

class ListItemsRequest(_message.Message):
    __slots__ = ["agent_id", "engine_kind", "page_size", "page_token", "parent_work_item_id", "run_id", "statuses", "tenant_key"]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PARENT_WORK_ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    engine_kind: str
    page_size: int
    page_token: str
    parent_work_item_id: str
    run_id: str
    statuses: _containers.RepeatedScalarFieldContainer[_work_item_pb2.WorkItemStatus]
    tenant_key: str
    def __init__(self, tenant_key: _Optional[str] = ..., statuses: _Optional[_Iterable[_Union[_work_item_pb2.WorkItemStatus, str]]] = ..., engine_kind: _Optional[str] = ..., run_id: _Optional[str] = ..., parent_work_item_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListItemsResponse(_message.Message):
    __slots__ = ["items", "next_page_token"]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_work_item_pb2.WorkItem]
    next_page_token: str
    def __init__(self, items: _Optional[_Iterable[_Union[_work_item_pb2.WorkItem, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WaitRequest(_message.Message):
    __slots__ = ["ids", "run_id", "tenant_key", "timeout"]
    IDS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_KEY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    run_id: str
    tenant_key: str
    timeout: _duration_pb2.Duration
    def __init__(self, tenant_key: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ..., run_id: _Optional[str] = ..., timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WaitResponse(_message.Message):
    __slots__ = ["done", "items"]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    done: bool
    items: _containers.RepeatedCompositeFieldContainer[_work_item_pb2.WorkItem]
    def __init__(self, done: bool = ..., items: _Optional[_Iterable[_Union[_work_item_pb2.WorkItem, _Mapping]]] = ...) -> None: ...
