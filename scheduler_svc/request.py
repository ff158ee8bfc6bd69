"""One generation request as the scheduler sees it: its parameters, its state and its output stream."""

from __future__ import annotations

import enum
import queue
from dataclasses import dataclass, field
from typing import Any, Sequence

from codeserve.v1 import common_pb2, scheduler_pb2


class State(enum.Enum):
    """A request's phase. WAITING: in the queue (new, or requeued after a retract or worker restart).
    PREFILL: admitted, extend chunks still to run. DECODE: one new token per step. FINISHED: done (it has a
    finish reason). Where a finished request still is (in a Forward in flight, failed to release) is the
    request table's (``scheduler_svc/requests.py``), which also makes every change of phase."""

    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    FINISHED = "finished"


class Finish(str, enum.Enum):
    """Finish reasons as the public API names them."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


@dataclass(frozen=True)
class Params:
    """Validated, immutable parameters of a request.

    ``max_new_tokens`` is the effective cap (already limited by the context: prompt_len + max_new_tokens
    <= n_positions); ``asked_max_new_tokens`` is what the client asked.
    """

    max_new_tokens: int
    asked_max_new_tokens: int
    sampling: common_pb2.SamplingParams
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    skip_special_tokens: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    return_prompt_logprobs: bool = False
    namespace: str = ""
    no_stop_trim: bool = False
    health_probe: bool = False  # a readiness probe: kept out of the request metrics and token counters
    router_id: str = ""  # the router that sent it (GenerateRequest.router_id): GetLoad's ``others`` leave it out


SIBLING_FAILED = "another call of the same HTTP request failed"  # abort_reason of AbortRequest.sibling_failed


@dataclass(frozen=True)
class StreamEnd:
    """Last item of a request's stream: ``code`` None means success; otherwise a grpc.StatusCode and message."""

    code: object = None
    message: str = ""


@dataclass(eq=False)
class Req:
    """A request. Token lists hold int token ids; ``kv_len`` counts tokens (from position 0) whose KV is
    written in the pool for the current admission. ``phase`` changes in the request table only
    (``scheduler_svc/requests.py``, which also resets ``kv_len`` and ``worker_knows`` on admission and requeue);
    after a Forward, ``kv_len`` and ``worker_knows`` are set in ``scheduler_svc/results.py`` only. The loop
    thread owns every mutable field except
    ``abort_requested`` (set by any thread) and ``out`` (the stream's queue, put from any thread: the Generate
    handler sets a ``stream_queue.LoopQueue`` read on the gRPC server's event loop; a SimpleQueue by default, read
    by whoever drives the loop without a server, as tests do).
    """

    rid: str
    prompt_ids: list[int]
    params: Params
    prompt_field: Any = None  # the same ids as a protobuf repeated int field (``scheduler_pb2.TokenIds.ids``):
    # ``extend_ids`` copies long runs of the prompt out of it in C; None: from ``prompt_ids``
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[common_pb2.TopLogprobs] = field(default_factory=list)
    prompt_logprobs: list[float] = field(default_factory=list)
    prompt_top_logprobs: list[common_pb2.TopLogprobs] = field(default_factory=list)
    phase: State = State.WAITING        # WAITING, PREFILL or DECODE, set by the request table only
    kv_len: int = 0
    cached_tokens: int = -1              # cached prefix of the first admission (-1: not yet admitted)
    worker_knows: bool = False           # the worker holds this request's slot table
    # the matched prefix's slots (a list, or the Match reply's repeated field), sent with the first chunk
    prefix_slot_ids: Sequence[int] = field(default_factory=list)
    admission: int = 0                   # order of the latest admission (larger = more recent)
    retractions: int = 0
    finish: Finish | None = None
    matched_stop: str = ""
    abort_requested: bool = False
    over_limits: bool = False            # queued with its group's first call (group_admission.py): no queue limit
    abort_reason: str = ""
    first_sent: bool = False
    sent_tokens: int = 0                 # output tokens already put on the stream
    stream: Any = None                   # scheduler_svc.output.OutputStream, set on submit
    early: Any = None                    # its early Match in flight or answered (``early_match.Pending``), until
    # the loop takes its receipt; set by the Generate handler before the request is queued
    out: "queue.SimpleQueue[scheduler_pb2.GenerateResponse | StreamEnd]" = field(default_factory=queue.SimpleQueue)

    @property
    def state(self) -> State:
        """FINISHED once the request has a finish reason (set by its output stream), else its ``phase``."""
        return State.FINISHED if self.finish is not None else self.phase

    @property
    def all_ids(self) -> list[int]:
        """Prompt followed by the generated tokens (the tokens a recompute must rebuild)."""
        return self.prompt_ids + self.output_ids

    def extend_ids(self, dst, start: int, end: int) -> None:
        """Appends ``all_ids[start:end]`` to ``dst``, a protobuf repeated int field. The prompt's part comes from
        ``prompt_field`` when there is one and the run is long: upb copies one repeated field into another in C
        (1,750 ids: ~1 us, against ~40 us from a list of Python ints), and the ids outside the run are deleted
        from the copy as fast."""
        n = len(self.prompt_ids)
        top = min(end, n)
        if start < top:
            if self.prompt_field is not None and top - start > 64:
                base = len(dst)
                dst.extend(self.prompt_field)
                del dst[base + top:]
                if start:
                    del dst[base:base + start]
            else:
                dst.extend(self.prompt_ids[start:top])
        if end > n:
            dst.extend(self.output_ids[max(start - n, 0):end - n])

    @property
    def pending_tokens(self) -> int:
        """Tokens whose KV is not written yet for the current admission (prefill rest, or 1 in decode)."""
        return len(self.prompt_ids) + len(self.output_ids) - self.kv_len

    @property
    def remaining_new_tokens(self) -> int:
        """Tokens this request may still generate."""
        return self.params.max_new_tokens - len(self.output_ids)

    @property
    def wants_prompt_logprobs(self) -> bool:
        """True while prompt logprobs are asked and not yet collected (forces a full recompute of the prompt)."""
        return self.params.return_prompt_logprobs and len(self.prompt_logprobs) < len(self.prompt_ids) - 1


def stop_ids(params: Params, eos_token_id: int) -> list[int]:
    """Token ids that end a request (its stop token ids, sorted, then EOS unless ignore_eos): the worker stops a
    multi-step item there, and the output stream finishes the request with "stop" on one of them."""
    ids = sorted(params.stop_token_ids)
    if not params.ignore_eos:
        ids.append(eos_token_id)
    return ids
