from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BatchOp(_message.Message):
    __slots__ = ("cache", "release", "match", "allocate")
    CACHE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    MATCH_FIELD_NUMBER: _ClassVar[int]
    ALLOCATE_FIELD_NUMBER: _ClassVar[int]
    cache: CacheRequestsRequest
    release: ReleaseRequestsRequest
    match: MatchRequest
    allocate: AllocateRequest
    def __init__(self, cache: _Optional[_Union[CacheRequestsRequest, _Mapping]] = ..., release: _Optional[_Union[ReleaseRequestsRequest, _Mapping]] = ..., match: _Optional[_Union[MatchRequest, _Mapping]] = ..., allocate: _Optional[_Union[AllocateRequest, _Mapping]] = ...) -> None: ...

class BatchRequest(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[BatchOp]
    def __init__(self, ops: _Optional[_Iterable[_Union[BatchOp, _Mapping]]] = ...) -> None: ...

class BatchResult(_message.Message):
    __slots__ = ("cache", "release", "match", "allocate")
    CACHE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    MATCH_FIELD_NUMBER: _ClassVar[int]
    ALLOCATE_FIELD_NUMBER: _ClassVar[int]
    cache: CacheRequestsResponse
    release: ReleaseRequestsResponse
    match: MatchResponse
    allocate: AllocateResponse
    def __init__(self, cache: _Optional[_Union[CacheRequestsResponse, _Mapping]] = ..., release: _Optional[_Union[ReleaseRequestsResponse, _Mapping]] = ..., match: _Optional[_Union[MatchResponse, _Mapping]] = ..., allocate: _Optional[_Union[AllocateResponse, _Mapping]] = ...) -> None: ...

class BatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchResult, _Mapping]]] = ...) -> None: ...

class Counters(_message.Message):
    __slots__ = ("capacity", "available", "evictable", "protected", "owned", "cached")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    EVICTABLE_FIELD_NUMBER: _ClassVar[int]
    PROTECTED_FIELD_NUMBER: _ClassVar[int]
    OWNED_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    capacity: int
    available: int
    evictable: int
    protected: int
    owned: int
    cached: int
    def __init__(self, capacity: _Optional[int] = ..., available: _Optional[int] = ..., evictable: _Optional[int] = ..., protected: _Optional[int] = ..., owned: _Optional[int] = ..., cached: _Optional[int] = ...) -> None: ...

class PoolMember(_message.Message):
    __slots__ = ("worker_id", "epoch", "capacity_tokens")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    epoch: str
    capacity_tokens: int
    def __init__(self, worker_id: _Optional[str] = ..., epoch: _Optional[str] = ..., capacity_tokens: _Optional[int] = ...) -> None: ...

class RegisterPoolRequest(_message.Message):
    __slots__ = ("op_id", "pool_id", "page_size", "members", "session_id")
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    op_id: str
    pool_id: str
    page_size: int
    members: _containers.RepeatedCompositeFieldContainer[PoolMember]
    session_id: str
    def __init__(self, op_id: _Optional[str] = ..., pool_id: _Optional[str] = ..., page_size: _Optional[int] = ..., members: _Optional[_Iterable[_Union[PoolMember, _Mapping]]] = ..., session_id: _Optional[str] = ...) -> None: ...

class RegisterPoolResponse(_message.Message):
    __slots__ = ("receipt", "flushed", "capacity", "page_size", "reserved_slot")
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    RESERVED_SLOT_FIELD_NUMBER: _ClassVar[int]
    receipt: Receipt
    flushed: bool
    capacity: int
    page_size: int
    reserved_slot: int
    def __init__(self, receipt: _Optional[_Union[Receipt, _Mapping]] = ..., flushed: _Optional[bool] = ..., capacity: _Optional[int] = ..., page_size: _Optional[int] = ..., reserved_slot: _Optional[int] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("owner", "lease_seconds")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    owner: str
    lease_seconds: float
    def __init__(self, owner: _Optional[str] = ..., lease_seconds: _Optional[float] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session_id", "replaced_session_id", "released_requests")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REPLACED_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    replaced_session_id: str
    released_requests: int
    def __init__(self, session_id: _Optional[str] = ..., replaced_session_id: _Optional[str] = ..., released_requests: _Optional[int] = ...) -> None: ...

class RenewSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class RenewSessionResponse(_message.Message):
    __slots__ = ("lease_seconds_left",)
    LEASE_SECONDS_LEFT_FIELD_NUMBER: _ClassVar[int]
    lease_seconds_left: float
    def __init__(self, lease_seconds_left: _Optional[float] = ...) -> None: ...

class Receipt(_message.Message):
    __slots__ = ("pool_id", "op_id", "operation", "asked_tokens", "delivered_tokens", "before", "after", "replayed")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    ASKED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    op_id: str
    operation: str
    asked_tokens: int
    delivered_tokens: int
    before: Counters
    after: Counters
    replayed: bool
    def __init__(self, pool_id: _Optional[str] = ..., op_id: _Optional[str] = ..., operation: _Optional[str] = ..., asked_tokens: _Optional[int] = ..., delivered_tokens: _Optional[int] = ..., before: _Optional[_Union[Counters, _Mapping]] = ..., after: _Optional[_Union[Counters, _Mapping]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class MatchItem(_message.Message):
    __slots__ = ("request_id", "namespace", "token_ids", "lock", "max_match_tokens", "allocate_up_to", "compute_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    MAX_MATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATE_UP_TO_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    namespace: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    lock: bool
    max_match_tokens: int
    allocate_up_to: int
    compute_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., namespace: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., lock: _Optional[bool] = ..., max_match_tokens: _Optional[int] = ..., allocate_up_to: _Optional[int] = ..., compute_tokens: _Optional[int] = ...) -> None: ...

class MatchRequest(_message.Message):
    __slots__ = ("op_id", "session_id", "pool_id", "items")
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    op_id: str
    session_id: str
    pool_id: str
    items: _containers.RepeatedCompositeFieldContainer[MatchItem]
    def __init__(self, op_id: _Optional[str] = ..., session_id: _Optional[str] = ..., pool_id: _Optional[str] = ..., items: _Optional[_Iterable[_Union[MatchItem, _Mapping]]] = ...) -> None: ...

class MatchResult(_message.Message):
    __slots__ = ("request_id", "cached_tokens", "slot_ids", "allocated_slot_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    cached_tokens: int
    slot_ids: _containers.RepeatedScalarFieldContainer[int]
    allocated_slot_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., cached_tokens: _Optional[int] = ..., slot_ids: _Optional[_Iterable[int]] = ..., allocated_slot_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class MatchResponse(_message.Message):
    __slots__ = ("receipt", "results", "allocation")
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    receipt: Receipt
    results: _containers.RepeatedCompositeFieldContainer[MatchResult]
    allocation: Receipt
    def __init__(self, receipt: _Optional[_Union[Receipt, _Mapping]] = ..., results: _Optional[_Iterable[_Union[MatchResult, _Mapping]]] = ..., allocation: _Optional[_Union[Receipt, _Mapping]] = ...) -> None: ...

class AllocItem(_message.Message):
    __slots__ = ("request_id", "num_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    num_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class AllocateRequest(_message.Message):
    __slots__ = ("op_id", "session_id", "pool_id", "items")
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    op_id: str
    session_id: str
    pool_id: str
    items: _containers.RepeatedCompositeFieldContainer[AllocItem]
    def __init__(self, op_id: _Optional[str] = ..., session_id: _Optional[str] = ..., pool_id: _Optional[str] = ..., items: _Optional[_Iterable[_Union[AllocItem, _Mapping]]] = ...) -> None: ...

class AllocResult(_message.Message):
    __slots__ = ("request_id", "slot_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    slot_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., slot_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AllocateResponse(_message.Message):
    __slots__ = ("receipt", "results", "relief")
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    RELIEF_FIELD_NUMBER: _ClassVar[int]
    receipt: Receipt
    results: _containers.RepeatedCompositeFieldContainer[AllocResult]
    relief: EvictionReceipt
    def __init__(self, receipt: _Optional[_Union[Receipt, _Mapping]] = ..., results: _Optional[_Iterable[_Union[AllocResult, _Mapping]]] = ..., relief: _Optional[_Union[EvictionReceipt, _Mapping]] = ...) -> None: ...

class AllocationShortfall(_message.Message):
    __slots__ = ("pool_id", "asked_tokens", "freed_by_eviction", "still_evictable", "available", "reason", "counters")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    ASKED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FREED_BY_EVICTION_FIELD_NUMBER: _ClassVar[int]
    STILL_EVICTABLE_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    asked_tokens: int
    freed_by_eviction: int
    still_evictable: int
    available: int
    reason: str
    counters: Counters
    def __init__(self, pool_id: _Optional[str] = ..., asked_tokens: _Optional[int] = ..., freed_by_eviction: _Optional[int] = ..., still_evictable: _Optional[int] = ..., available: _Optional[int] = ..., reason: _Optional[str] = ..., counters: _Optional[_Union[Counters, _Mapping]] = ...) -> None: ...

class EvictionReceipt(_message.Message):
    __slots__ = ("asked_tokens", "freed_tokens", "nodes_evicted", "before", "after")
    ASKED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FREED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NODES_EVICTED_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    asked_tokens: int
    freed_tokens: int
    nodes_evicted: int
    before: Counters
    after: Counters
    def __init__(self, asked_tokens: _Optional[int] = ..., freed_tokens: _Optional[int] = ..., nodes_evicted: _Optional[int] = ..., before: _Optional[_Union[Counters, _Mapping]] = ..., after: _Optional[_Union[Counters, _Mapping]] = ...) -> None: ...

class CacheItem(_message.Message):
    __slots__ = ("request_id", "token_ids", "finished")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finished: bool
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finished: _Optional[bool] = ...) -> None: ...

class CacheRequestsRequest(_message.Message):
    __slots__ = ("op_id", "session_id", "pool_id", "items")
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    op_id: str
    session_id: str
    pool_id: str
    items: _containers.RepeatedCompositeFieldContainer[CacheItem]
    def __init__(self, op_id: _Optional[str] = ..., session_id: _Optional[str] = ..., pool_id: _Optional[str] = ..., items: _Optional[_Iterable[_Union[CacheItem, _Mapping]]] = ...) -> None: ...

class CacheResult(_message.Message):
    __slots__ = ("request_id", "already_cached_tokens", "inserted_tokens", "freed_tokens", "prefix_slot_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ALREADY_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INSERTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FREED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    already_cached_tokens: int
    inserted_tokens: int
    freed_tokens: int
    prefix_slot_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., already_cached_tokens: _Optional[int] = ..., inserted_tokens: _Optional[int] = ..., freed_tokens: _Optional[int] = ..., prefix_slot_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CacheRequestsResponse(_message.Message):
    __slots__ = ("receipt", "results")
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    receipt: Receipt
    results: _containers.RepeatedCompositeFieldContainer[CacheResult]
    def __init__(self, receipt: _Optional[_Union[Receipt, _Mapping]] = ..., results: _Optional[_Iterable[_Union[CacheResult, _Mapping]]] = ...) -> None: ...

class ReleaseRequestsRequest(_message.Message):
    __slots__ = ("op_id", "session_id", "pool_id", "request_ids")
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    op_id: str
    session_id: str
    pool_id: str
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, op_id: _Optional[str] = ..., session_id: _Optional[str] = ..., pool_id: _Optional[str] = ..., request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseRequestsResponse(_message.Message):
    __slots__ = ("receipt", "freed_tokens")
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    FREED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    receipt: Receipt
    freed_tokens: int
    def __init__(self, receipt: _Optional[_Union[Receipt, _Mapping]] = ..., freed_tokens: _Optional[int] = ...) -> None: ...

class EvictRequest(_message.Message):
    __slots__ = ("op_id", "pool_id", "num_tokens")
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    op_id: str
    pool_id: str
    num_tokens: int
    def __init__(self, op_id: _Optional[str] = ..., pool_id: _Optional[str] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class EvictResponse(_message.Message):
    __slots__ = ("receipt", "eviction")
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    EVICTION_FIELD_NUMBER: _ClassVar[int]
    receipt: Receipt
    eviction: EvictionReceipt
    def __init__(self, receipt: _Optional[_Union[Receipt, _Mapping]] = ..., eviction: _Optional[_Union[EvictionReceipt, _Mapping]] = ...) -> None: ...

class FlushRequest(_message.Message):
    __slots__ = ("op_id", "pool_id")
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    op_id: str
    pool_id: str
    def __init__(self, op_id: _Optional[str] = ..., pool_id: _Optional[str] = ...) -> None: ...

class FlushResponse(_message.Message):
    __slots__ = ("receipt", "freed_tokens")
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    FREED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    receipt: Receipt
    freed_tokens: int
    def __init__(self, receipt: _Optional[_Union[Receipt, _Mapping]] = ..., freed_tokens: _Optional[int] = ...) -> None: ...

class GetPoolRequest(_message.Message):
    __slots__ = ("pool_id",)
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    def __init__(self, pool_id: _Optional[str] = ...) -> None: ...

class PoolStatus(_message.Message):
    __slots__ = ("pool_id", "page_size", "members", "counters", "requests", "match_queries_tokens", "match_hit_tokens", "fundable_tokens", "budget_derivation")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MATCH_QUERIES_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MATCH_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FUNDABLE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_DERIVATION_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    page_size: int
    members: _containers.RepeatedCompositeFieldContainer[PoolMember]
    counters: Counters
    requests: int
    match_queries_tokens: int
    match_hit_tokens: int
    fundable_tokens: int
    budget_derivation: str
    def __init__(self, pool_id: _Optional[str] = ..., page_size: _Optional[int] = ..., members: _Optional[_Iterable[_Union[PoolMember, _Mapping]]] = ..., counters: _Optional[_Union[Counters, _Mapping]] = ..., requests: _Optional[int] = ..., match_queries_tokens: _Optional[int] = ..., match_hit_tokens: _Optional[int] = ..., fundable_tokens: _Optional[int] = ..., budget_derivation: _Optional[str] = ...) -> None: ...

class GetPoolResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolStatus]
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolStatus, _Mapping]]] = ...) -> None: ...

class CheckIntegrityRequest(_message.Message):
    __slots__ = ("pool_id",)
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    def __init__(self, pool_id: _Optional[str] = ...) -> None: ...

class CheckIntegrityResponse(_message.Message):
    __slots__ = ("violations",)
    VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    violations: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, violations: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("pool_id", "from_sequence")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    from_sequence: int
    def __init__(self, pool_id: _Optional[str] = ..., from_sequence: _Optional[int] = ...) -> None: ...

class PrefixEvent(_message.Message):
    __slots__ = ("sequence", "pool_id", "kind", "namespace", "token_ids", "num_tokens")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    pool_id: str
    kind: str
    namespace: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_tokens: int
    def __init__(self, sequence: _Optional[int] = ..., pool_id: _Optional[str] = ..., kind: _Optional[str] = ..., namespace: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class ProbePrefixRequest(_message.Message):
    __slots__ = ("namespace", "token_ids", "pool_ids")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    POOL_IDS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    pool_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., pool_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PoolProbe(_message.Message):
    __slots__ = ("pool_id", "epochs", "cached_tokens", "fundable_tokens", "capacity", "page_size")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FUNDABLE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    epochs: _containers.RepeatedScalarFieldContainer[str]
    cached_tokens: int
    fundable_tokens: int
    capacity: int
    page_size: int
    def __init__(self, pool_id: _Optional[str] = ..., epochs: _Optional[_Iterable[str]] = ..., cached_tokens: _Optional[int] = ..., fundable_tokens: _Optional[int] = ..., capacity: _Optional[int] = ..., page_size: _Optional[int] = ...) -> None: ...

class ProbePrefixResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolProbe]
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolProbe, _Mapping]]] = ...) -> None: ...
