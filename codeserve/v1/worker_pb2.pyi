from codeserve.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "epoch", "model_name", "model_path", "n_layer", "n_head", "kv_heads", "head_dim", "n_embd", "n_positions", "vocab_size", "eos_token_id", "dtype", "kv_bytes_per_token", "capacity_tokens", "page_size", "pool_slots", "device", "attention_backend")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    N_LAYER_FIELD_NUMBER: _ClassVar[int]
    N_HEAD_FIELD_NUMBER: _ClassVar[int]
    KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    N_EMBD_FIELD_NUMBER: _ClassVar[int]
    N_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    POOL_SLOTS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_BACKEND_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    epoch: str
    model_name: str
    model_path: str
    n_layer: int
    n_head: int
    kv_heads: int
    head_dim: int
    n_embd: int
    n_positions: int
    vocab_size: int
    eos_token_id: int
    dtype: str
    kv_bytes_per_token: int
    capacity_tokens: int
    page_size: int
    pool_slots: int
    device: str
    attention_backend: str
    def __init__(self, worker_id: _Optional[str] = ..., epoch: _Optional[str] = ..., model_name: _Optional[str] = ..., model_path: _Optional[str] = ..., n_layer: _Optional[int] = ..., n_head: _Optional[int] = ..., kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., n_embd: _Optional[int] = ..., n_positions: _Optional[int] = ..., vocab_size: _Optional[int] = ..., eos_token_id: _Optional[int] = ..., dtype: _Optional[str] = ..., kv_bytes_per_token: _Optional[int] = ..., capacity_tokens: _Optional[int] = ..., page_size: _Optional[int] = ..., pool_slots: _Optional[int] = ..., device: _Optional[str] = ..., attention_backend: _Optional[str] = ...) -> None: ...

class ForwardItem(_message.Message):
    __slots__ = ("request_id", "input_ids", "position_start", "slot_ids", "has_prefix", "prefix_slot_ids", "prefix_token_ids", "sampling", "sample", "return_logprob", "top_logprobs_num", "return_prompt_logprobs", "prompt_len", "decode_steps", "stop_token_ids", "input_from_last_sample")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    POSITION_START_FIELD_NUMBER: _ClassVar[int]
    SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    HAS_PREFIX_FIELD_NUMBER: _ClassVar[int]
    PREFIX_SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    RETURN_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_NUM_FIELD_NUMBER: _ClassVar[int]
    RETURN_PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LEN_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    INPUT_FROM_LAST_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    input_ids: _containers.RepeatedScalarFieldContainer[int]
    position_start: int
    slot_ids: _containers.RepeatedScalarFieldContainer[int]
    has_prefix: bool
    prefix_slot_ids: _containers.RepeatedScalarFieldContainer[int]
    prefix_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    sample: bool
    return_logprob: bool
    top_logprobs_num: int
    return_prompt_logprobs: bool
    prompt_len: int
    decode_steps: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    input_from_last_sample: bool
    def __init__(self, request_id: _Optional[str] = ..., input_ids: _Optional[_Iterable[int]] = ..., position_start: _Optional[int] = ..., slot_ids: _Optional[_Iterable[int]] = ..., has_prefix: _Optional[bool] = ..., prefix_slot_ids: _Optional[_Iterable[int]] = ..., prefix_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., sample: _Optional[bool] = ..., return_logprob: _Optional[bool] = ..., top_logprobs_num: _Optional[int] = ..., return_prompt_logprobs: _Optional[bool] = ..., prompt_len: _Optional[int] = ..., decode_steps: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., input_from_last_sample: _Optional[bool] = ...) -> None: ...

class ForwardRequest(_message.Message):
    __slots__ = ("expected_epoch", "items", "seq", "after_seq", "before_seq", "release_request_ids")
    EXPECTED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    BEFORE_SEQ_FIELD_NUMBER: _ClassVar[int]
    RELEASE_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    expected_epoch: str
    items: _containers.RepeatedCompositeFieldContainer[ForwardItem]
    seq: int
    after_seq: int
    before_seq: int
    release_request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, expected_epoch: _Optional[str] = ..., items: _Optional[_Iterable[_Union[ForwardItem, _Mapping]]] = ..., seq: _Optional[int] = ..., after_seq: _Optional[int] = ..., before_seq: _Optional[int] = ..., release_request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ForwardResult(_message.Message):
    __slots__ = ("request_id", "sampled", "next_token_id", "logprob", "top_logprobs", "prompt_logprobs", "prompt_top_logprobs", "next_token_ids", "logprobs", "skipped")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    sampled: bool
    next_token_id: int
    logprob: float
    top_logprobs: _common_pb2.TopLogprobs
    prompt_logprobs: _containers.RepeatedScalarFieldContainer[float]
    prompt_top_logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopLogprobs]
    next_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    skipped: bool
    def __init__(self, request_id: _Optional[str] = ..., sampled: _Optional[bool] = ..., next_token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., top_logprobs: _Optional[_Union[_common_pb2.TopLogprobs, _Mapping]] = ..., prompt_logprobs: _Optional[_Iterable[float]] = ..., prompt_top_logprobs: _Optional[_Iterable[_Union[_common_pb2.TopLogprobs, _Mapping]]] = ..., next_token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., skipped: _Optional[bool] = ...) -> None: ...

class ForwardResponse(_message.Message):
    __slots__ = ("results", "forward_seconds", "device_seconds")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ForwardResult]
    forward_seconds: float
    device_seconds: float
    def __init__(self, results: _Optional[_Iterable[_Union[ForwardResult, _Mapping]]] = ..., forward_seconds: _Optional[float] = ..., device_seconds: _Optional[float] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("request_ids",)
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...
