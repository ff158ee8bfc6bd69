"""Validation of a GenerateRequest into a Req. Every rejection names the value and the limit."""

from __future__ import annotations

import math
import uuid

import numpy as np
from tokenizers import Tokenizer

from codeserve.v1 import common_pb2, scheduler_pb2, worker_pb2
from scheduler_svc.request import Params, Req

MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 16  # stop strings per request (the gateway's max_stop_strings default)
MAX_STOP_CHARS = 1024  # characters per stop string (the gateway's max_stop_chars default)
MAX_GROUP_SIZE = 1024  # calls of one HTTP request (GenerateRequest.group_size; the gateway sends at most 256)


class InvalidRequest(ValueError):
    """The request cannot be served as asked (gRPC INVALID_ARGUMENT); the message says why."""


def _check_sampling(s: common_pb2.SamplingParams) -> None:
    values = {"temperature": s.temperature, "top_p": s.top_p, "min_p": s.min_p,
              "repetition_penalty": s.repetition_penalty, "frequency_penalty": s.frequency_penalty,
              "presence_penalty": s.presence_penalty}
    for name, value in values.items():
        if not math.isfinite(value):
            raise InvalidRequest(f"{name} must be a finite number, got {value}")
    if s.temperature < 0:
        raise InvalidRequest(f"temperature must be >= 0, got {s.temperature}")
    if not 0 <= s.top_p <= 1:
        raise InvalidRequest(f"top_p must be in (0, 1] (0 = off), got {s.top_p}")
    if s.top_k < -1:
        raise InvalidRequest(f"top_k must be -1, 0 (off) or positive, got {s.top_k}")
    if not 0 <= s.min_p <= 1:
        raise InvalidRequest(f"min_p must be in [0, 1], got {s.min_p}")
    if s.repetition_penalty < 0:
        raise InvalidRequest(f"repetition_penalty must be > 0 (0 or 1 = off), got {s.repetition_penalty}")
    for name in ("frequency_penalty", "presence_penalty"):
        if not -2 <= values[name] <= 2:
            raise InvalidRequest(f"{name} must be in [-2, 2], got {values[name]}")


def prompt_ids(request: scheduler_pb2.GenerateRequest, tokenizer: Tokenizer, vocab_size: int) -> list[int]:
    """Token ids of the prompt (text is encoded with the checkpoint tokenizer). Raises InvalidRequest
    when the prompt is empty or missing, or an id is outside [0, vocab_size)."""
    which = request.WhichOneof("input")
    if which == "text":
        ids = tokenizer.encode(request.text).ids if request.text else []
    elif which == "input_ids":
        ids = request.input_ids.ids
    else:
        raise InvalidRequest("prompt is empty: set text or input_ids")
    if not len(ids):
        raise InvalidRequest("prompt is empty")
    arr = np.asarray(ids, dtype=np.int64)  # one pass in C (a keystroke's prompt is its whole file)
    bad = np.flatnonzero((arr < 0) | (arr >= vocab_size))
    if bad.size:
        i = int(bad[0])
        raise InvalidRequest(f"token id {int(arr[i])} at position {i} is outside the vocabulary [0, {vocab_size})")
    return arr.tolist()


def build_request(request: scheduler_pb2.GenerateRequest, tokenizer: Tokenizer, info: worker_pb2.WorkerInfo,
                  capacity: int) -> Req:
    """A Req for a valid request. ``capacity`` is the KV pool size in tokens. Raises InvalidRequest.

    prompt_len >= n_positions is rejected; prompt_len + max_new_tokens > n_positions caps generation at
    the context limit (finish_reason "length"). Generation is likewise capped so that prompt and output fit
    the KV pool (``capacity``): a request alone in the pool can always run to its end."""
    ids = prompt_ids(request, tokenizer, info.vocab_size)
    n_pos = info.n_positions
    if len(ids) >= n_pos:
        raise InvalidRequest(f"prompt has {len(ids)} tokens; the context limit (n_positions) is {n_pos}, "
                             f"so a prompt may have at most {n_pos - 1} tokens")
    if len(ids) + 1 > capacity:
        raise InvalidRequest(f"prompt has {len(ids)} tokens; the KV pool holds {capacity} tokens in all")
    if request.max_new_tokens < 0:
        raise InvalidRequest(f"max_new_tokens must be >= 0, got {request.max_new_tokens}")
    _check_sampling(request.sampling)
    if not 0 <= request.top_logprobs_num <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}], got {request.top_logprobs_num}")
    if not 0 <= request.group_size <= MAX_GROUP_SIZE:
        raise InvalidRequest(f"group_size must be in [0, {MAX_GROUP_SIZE}], got {request.group_size}")
    if len(request.stop) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"stop has {len(request.stop)} strings; the limit is {MAX_STOP_STRINGS}")
    if any(not s for s in request.stop):
        raise InvalidRequest("stop strings must be non-empty")
    for s in request.stop:
        if len(s) > MAX_STOP_CHARS:
            raise InvalidRequest(f"stop has a string of {len(s)} characters; the limit is {MAX_STOP_CHARS}")
    for tok in request.stop_token_ids:
        if not 0 <= tok < info.vocab_size:
            raise InvalidRequest(f"stop token id {tok} is outside the vocabulary [0, {info.vocab_size})")
    sampling = common_pb2.SamplingParams()
    sampling.CopyFrom(request.sampling)
    params = Params(
        max_new_tokens=min(request.max_new_tokens, n_pos - len(ids), capacity - len(ids)), asked_max_new_tokens=request.max_new_tokens,
        sampling=sampling, stop=tuple(request.stop), stop_token_ids=frozenset(request.stop_token_ids),
        ignore_eos=request.ignore_eos, skip_special_tokens=request.skip_special_tokens,
        return_logprob=request.return_logprob, top_logprobs_num=request.top_logprobs_num,
        return_prompt_logprobs=request.return_prompt_logprobs, namespace=request.namespace,
        no_stop_trim=request.no_stop_trim, health_probe=request.health_probe, router_id=request.router_id)
    # the ids as a repeated field too: the request's own when it sent ids, else built once here (Req.extend_ids)
    field = request.input_ids.ids if request.WhichOneof("input") == "input_ids" else scheduler_pb2.TokenIds(ids=ids).ids
    return Req(rid=request.request_id or uuid.uuid4().hex, prompt_ids=ids, params=params, prompt_field=field)
