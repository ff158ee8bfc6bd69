from codeserve.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "text", "input_ids", "sampling", "max_new_tokens", "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens", "return_logprob", "top_logprobs_num", "return_prompt_logprobs", "namespace", "no_stop_trim", "health_probe", "router_id", "group_id", "group_size")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RETURN_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_NUM_FIELD_NUMBER: _ClassVar[int]
    RETURN_PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NO_STOP_TRIM_FIELD_NUMBER: _ClassVar[int]
    HEALTH_PROBE_FIELD_NUMBER: _ClassVar[int]
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    input_ids: TokenIds
    sampling: _common_pb2.SamplingParams
    max_new_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    skip_special_tokens: bool
    return_logprob: bool
    top_logprobs_num: int
    return_prompt_logprobs: bool
    namespace: str
    no_stop_trim: bool
    health_probe: bool
    router_id: str
    group_id: str
    group_size: int
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., input_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., max_new_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., skip_special_tokens: _Optional[bool] = ..., return_logprob: _Optional[bool] = ..., top_logprobs_num: _Optional[int] = ..., return_prompt_logprobs: _Optional[bool] = ..., namespace: _Optional[str] = ..., no_stop_trim: _Optional[bool] = ..., health_probe: _Optional[bool] = ..., router_id: _Optional[str] = ..., group_id: _Optional[str] = ..., group_size: _Optional[int] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "token_ids", "text", "logprobs", "top_logprobs", "prompt_tokens", "cached_tokens", "prompt_token_ids", "prompt_logprobs", "prompt_top_logprobs", "finish_reason", "matched_stop", "completion_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    MATCHED_STOP_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    top_logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopLogprobs]
    prompt_tokens: int
    cached_tokens: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_logprobs: _containers.RepeatedScalarFieldContainer[float]
    prompt_top_logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopLogprobs]
    finish_reason: str
    matched_stop: str
    completion_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., logprobs: _Optional[_Iterable[float]] = ..., top_logprobs: _Optional[_Iterable[_Union[_common_pb2.TopLogprobs, _Mapping]]] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., prompt_logprobs: _Optional[_Iterable[float]] = ..., prompt_top_logprobs: _Optional[_Iterable[_Union[_common_pb2.TopLogprobs, _Mapping]]] = ..., finish_reason: _Optional[str] = ..., matched_stop: _Optional[str] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id", "sibling_failed")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SIBLING_FAILED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    sibling_failed: bool
    def __init__(self, request_id: _Optional[str] = ..., sibling_failed: _Optional[bool] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class GetLoadRequest(_message.Message):
    __slots__ = ("request_metrics", "router_id")
    REQUEST_METRICS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    request_metrics: bool
    router_id: str
    def __init__(self, request_metrics: _Optional[bool] = ..., router_id: _Optional[str] = ...) -> None: ...

class CallLoad(_message.Message):
    __slots__ = ("live", "waiting", "waiting_tokens")
    LIVE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    WAITING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    live: int
    waiting: int
    waiting_tokens: int
    def __init__(self, live: _Optional[int] = ..., waiting: _Optional[int] = ..., waiting_tokens: _Optional[int] = ...) -> None: ...

class PoolCounters(_message.Message):
    __slots__ = ("pool_id", "capacity", "available", "evictable", "protected", "owned")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    EVICTABLE_FIELD_NUMBER: _ClassVar[int]
    PROTECTED_FIELD_NUMBER: _ClassVar[int]
    OWNED_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    capacity: int
    available: int
    evictable: int
    protected: int
    owned: int
    def __init__(self, pool_id: _Optional[str] = ..., capacity: _Optional[int] = ..., available: _Optional[int] = ..., evictable: _Optional[int] = ..., protected: _Optional[int] = ..., owned: _Optional[int] = ...) -> None: ...

class GetLoadResponse(_message.Message):
    __slots__ = ("running", "waiting", "waiting_tokens", "pools", "seconds_since_last_batch", "batches_completed", "prefix_query_tokens", "prefix_hit_tokens", "prompt_tokens_total", "generation_tokens_total", "unhealthy_reason", "request_metrics", "pool_error", "outage_reason", "others")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    WAITING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_LAST_BATCH_FIELD_NUMBER: _ClassVar[int]
    BATCHES_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    PREFIX_QUERY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_METRICS_FIELD_NUMBER: _ClassVar[int]
    POOL_ERROR_FIELD_NUMBER: _ClassVar[int]
    OUTAGE_REASON_FIELD_NUMBER: _ClassVar[int]
    OTHERS_FIELD_NUMBER: _ClassVar[int]
    running: int
    waiting: int
    waiting_tokens: int
    pools: _containers.RepeatedCompositeFieldContainer[PoolCounters]
    seconds_since_last_batch: float
    batches_completed: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    prompt_tokens_total: int
    generation_tokens_total: int
    unhealthy_reason: str
    request_metrics: str
    pool_error: str
    outage_reason: str
    others: CallLoad
    def __init__(self, running: _Optional[int] = ..., waiting: _Optional[int] = ..., waiting_tokens: _Optional[int] = ..., pools: _Optional[_Iterable[_Union[PoolCounters, _Mapping]]] = ..., seconds_since_last_batch: _Optional[float] = ..., batches_completed: _Optional[int] = ..., prefix_query_tokens: _Optional[int] = ..., prefix_hit_tokens: _Optional[int] = ..., prompt_tokens_total: _Optional[int] = ..., generation_tokens_total: _Optional[int] = ..., unhealthy_reason: _Optional[str] = ..., request_metrics: _Optional[str] = ..., pool_error: _Optional[str] = ..., outage_reason: _Optional[str] = ..., others: _Optional[_Union[CallLoad, _Mapping]] = ...) -> None: ...

class FlushCacheRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FlushCacheResponse(_message.Message):
    __slots__ = ("freed_tokens",)
    FREED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    freed_tokens: int
    def __init__(self, freed_tokens: _Optional[int] = ...) -> None: ...

class ServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerInfoResponse(_message.Message):
    __slots__ = ("model_name", "model_path", "n_positions", "vocab_size", "eos_token_id", "max_running_requests", "chunk_size", "page_size", "max_queued_requests", "pools", "attention_backend", "device", "dtype")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    N_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    model_path: str
    n_positions: int
    vocab_size: int
    eos_token_id: int
    max_running_requests: int
    chunk_size: int
    page_size: int
    max_queued_requests: int
    pools: _containers.RepeatedCompositeFieldContainer[PoolCounters]
    attention_backend: str
    device: str
    dtype: str
    def __init__(self, model_name: _Optional[str] = ..., model_path: _Optional[str] = ..., n_positions: _Optional[int] = ..., vocab_size: _Optional[int] = ..., eos_token_id: _Optional[int] = ..., max_running_requests: _Optional[int] = ..., chunk_size: _Optional[int] = ..., page_size: _Optional[int] = ..., max_queued_requests: _Optional[int] = ..., pools: _Optional[_Iterable[_Union[PoolCounters, _Mapping]]] = ..., attention_backend: _Optional[str] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ...) -> None: ...
