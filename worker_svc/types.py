"""Plain request/response types of the worker engine (the servicer converts protobuf to and from these)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from worker_svc.sampler import SamplingParams


def _keyword_maker(cls):
    """A fast constructor of the frozen dataclass ``cls``: ``cls.make(field=value, ...)`` takes every field by
    keyword (defaults too; Python's own argument binding raises TypeError naming a missing or unknown one, so
    two fields of one type cannot be swapped silently) and fills the instance's ``__dict__`` without running
    ``__init__`` (which sets each field through ``object.__setattr__``: several times slower, and the worker
    builds one item and one output per request per Forward). The values are not converted or checked: the
    caller passes the field types. Generated once per class, as dataclasses generates ``__init__``."""
    names = [f.name for f in fields(cls)]
    namespace = {"_new": object.__new__, "cls": cls}
    values = "{" + ", ".join(f"{n!r}: {n}" for n in names) + "}"  # a dict display: built in one step, read fast
    exec(f"def make(*, {', '.join(names)}):\n    obj = _new(cls)\n    obj.__dict__.update({values})\n    return obj\n",
         namespace)
    make = namespace["make"]
    make.__qualname__ = f"{cls.__name__}.make"
    make.__doc__ = f"A {cls.__name__} from every field by keyword, without __init__ (see ``_keyword_maker``)."
    return staticmethod(make)


class WorkerError(Exception):
    """A rejected call. ``code`` is a gRPC status name: INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION,
    ABORTED (a Forward it had to follow failed or never completed)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ForwardItem:
    """One request of a forward batch; see ``ForwardItem`` in worker.proto for the field contract."""

    request_id: str
    input_ids: tuple[int, ...]
    position_start: int
    slot_ids: tuple[int, ...]
    has_prefix: bool = False
    prefix_slot_ids: tuple[int, ...] = ()
    prefix_token_ids: tuple[int, ...] = ()
    sampling: SamplingParams = field(default_factory=SamplingParams)
    sample: bool = True
    return_logprob: bool = False
    top_logprobs_num: int = 0
    return_prompt_logprobs: bool = False
    prompt_len: int = 0
    decode_steps: int = 1  # > 1: multi-step decode (``multistep.py``); slot_ids holds decode_steps slots
    stop_token_ids: tuple[int, ...] = ()  # sampling one of these ends the item's steps; the request is then stopped
    input_from_last_sample: bool = False  # input = the token this worker sampled last for the request (overlap)


@dataclass(frozen=True)
class ForwardOutput:
    """Result for one item. ``next_token_id`` is -1 when ``sampled`` is false.

    ``logprob``: raw log-probability of the sampled token (0.0 unless return_logprob);
    ``top_logprobs``: (token id, logprob) best first; ``prompt_logprobs``: one per input token it applies
    to (input_ids[1:], plus input_ids[0] when position_start > 0, in order), with ``prompt_top_logprobs``
    aligned to it when top_logprobs_num > 0. Multi-step decode: ``next_token_ids`` every sampled token in
    order (``next_token_id`` is the last), ``logprobs`` theirs (with return_logprob); K/V was written for
    ``len(next_token_ids)`` tokens. ``skipped``: an ``input_from_last_sample`` item of a request whose
    previous Forward ended at a stop token; nothing was written, committed or sampled.
    """

    request_id: str
    sampled: bool
    next_token_id: int = -1
    logprob: float = 0.0
    top_logprobs: tuple[tuple[int, float], ...] = ()
    prompt_logprobs: tuple[float, ...] = ()
    prompt_top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()
    next_token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    skipped: bool = False


ForwardItem.make = _keyword_maker(ForwardItem)
ForwardOutput.make = _keyword_maker(ForwardOutput)


@dataclass(frozen=True)
class ForwardResult:
    """Outputs in item order, the seconds spent in the model and the sampler (host work included), and the
    device seconds of the model's steps alone (``step_clock.StepClock``; 0.0 when every item was skipped);
    ``device_span_ns``: those steps' (start, end) on ``time.monotonic_ns()``'s clock when the engine has an
    ``origin`` (``forward_log.DeviceOrigin``: the Forward timeline is on), else None. ``prepared_ns`` and ``launch``
    say when its preparation at arrival ended and whether it was launched behind; ``marks`` when it passed each stage
    of its way through the engine (``marks.Marks``; the timeline's last columns)."""

    outputs: tuple[ForwardOutput, ...]
    forward_seconds: float
    device_seconds: float = 0.0
    device_span_ns: tuple[int, int] | None = None
    prepared_ns: int = -1  # time.monotonic_ns() once its metadata (or extend) was prepared at arrival; -1: not
    launch: str = "turn"  # "behind": launched behind the Forward ahead on the device (_launch_behind, _extend_behind)
    marks: tuple[tuple[str, int], ...] = ()  # (name, time.monotonic_ns()) of each stage it passed (``marks.Marks``)


@dataclass(frozen=True)
class EngineInfo:
    """What ``Worker.Info`` reports (field names as in WorkerInfo)."""

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
