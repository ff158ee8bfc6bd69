"""POST /v1/completions (OpenAI legacy completions) and GET /v1/models."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from codeserve.v1 import scheduler_pb2
from gateway.context import GatewayContext, get_ctx
from gateway.disconnect import GuardedStreamingResponse
from gateway.errors import invalid
from gateway.fim import fim_prompts, fim_stop_ids
from gateway.fanout import collect_all, open_streams, stream_response
from gateway.generation import GenerationResult, SamplingRequest, merge_streams
from gateway.logprobs import LegacyLogprobs, legacy_logprobs, merge, prompt_logprob_lists
from gateway.prompts import (
    PromptInput, cap_new_tokens, check_logprobs, check_n, parse_completion_prompt, parse_stop, parse_stop_token_ids,
)
from gateway.schemas import UINT64_MAX, CompletionRequest, SamplingFields
from gateway.tokenizer import PieceTracker

router = APIRouter()


def sampling_request(body: SamplingFields, ctx: GatewayContext, max_new_tokens: int, choice: int,
                     logprobs: int | None, prompt_logprobs: bool) -> SamplingRequest:
    """The SamplingRequest of choice ``choice`` (its seed is ``seed + choice`` so n > 1 choices differ)."""
    return SamplingRequest(
        max_new_tokens=max_new_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        repetition_penalty=body.repetition_penalty,
        frequency_penalty=body.frequency_penalty,
        presence_penalty=body.presence_penalty,
        seed=None if body.seed is None else (body.seed + choice) % (UINT64_MAX + 1),
        stop=parse_stop(body.stop, ctx.settings),
        stop_token_ids=parse_stop_token_ids(body.stop_token_ids, ctx.settings),
        ignore_eos=body.ignore_eos,
        skip_special_tokens=body.skip_special_tokens,
        no_stop_trim=body.include_stop_str_in_output,
        return_logprob=logprobs is not None,
        top_logprobs_num=logprobs or 0,
        return_prompt_logprobs=prompt_logprobs,
    )


def usage(results: list[GenerationResult], per_prompt: int) -> dict:
    """OpenAI usage: prompt tokens and cached tokens counted once per prompt, completion tokens
    summed over all choices."""
    firsts = results[::per_prompt]
    return usage_counts(sum(r.prompt_tokens for r in firsts), sum(r.completion_tokens for r in results),
                        sum(r.cached_tokens for r in firsts))


def usage_counts(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    """The OpenAI ``usage`` object of token counts (whole answers and the last streamed chunk alike)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


@dataclass(frozen=True)
class _Job:
    prompt: PromptInput
    request: scheduler_pb2.GenerateRequest


class _ChoiceState:
    """Per-choice state of a streamed completion: echo, logprob offsets."""

    def __init__(self, ctx: GatewayContext, body: CompletionRequest, prompt: PromptInput) -> None:
        self.ctx = ctx
        self.body = body
        self.prompt = prompt
        self.echo_text = _echo_text(ctx, prompt) if body.echo else ""
        self.tracker = PieceTracker(ctx.tokenizer, body.skip_special_tokens, len(self.echo_text))
        self.started = False

    def piece(self, msg: scheduler_pb2.GenerateResponse) -> tuple[str, LegacyLogprobs | None]:
        """Text and logprobs this message adds to the choice (the echo goes with the first one)."""
        text = msg.text
        logprobs = None
        count = self.body.logprobs
        if count is not None:
            tops = [tuple((e.token_id, e.logprob) for e in t.entries) for t in msg.top_logprobs]
            logprobs = legacy_logprobs(self.ctx.tokenizer, self.tracker, list(msg.token_ids), list(msg.logprobs),
                                       tops, count)
        if not self.started:
            self.started = True
            if self.body.echo:
                text = self.echo_text + text
                if count is not None:
                    prompt_part = _prompt_logprobs(self.ctx, self.prompt, msg.prompt_logprobs,
                                                   [tuple((e.token_id, e.logprob) for e in t.entries)
                                                    for t in msg.prompt_top_logprobs], count)
                    logprobs = merge(prompt_part, logprobs)
        return text, logprobs


def _echo_text(ctx: GatewayContext, prompt: PromptInput) -> str:
    # Text prompts are echoed byte for byte; token prompts as their decoded text, special tokens kept.
    return prompt.text if prompt.text is not None else ctx.tokenizer.decode(list(prompt.ids))


def _prompt_logprobs(ctx: GatewayContext, prompt: PromptInput, logprobs, tops, count: int) -> LegacyLogprobs:
    lps, top_lists = prompt_logprob_lists(prompt.ids, tuple(logprobs), tuple(tops))
    tracker = PieceTracker(ctx.tokenizer, False, 0)
    return legacy_logprobs(ctx.tokenizer, tracker, list(prompt.ids), lps, top_lists, count)


async def _jobs(body: CompletionRequest, ctx: GatewayContext, completion_id: str) -> tuple[list[_Job], int]:
    if (problem := body.unsupported()) is not None:
        raise invalid(problem[1], problem[0])
    if body.suffix is not None:
        prompts = await fim_prompts(body.prompt, body.suffix, body.fim_mode or "psm", ctx.tokenizer, ctx.settings)
    else:
        prompts = await parse_completion_prompt(body.prompt, ctx.tokenizer, ctx.settings)
    check_n(body.n, len(prompts), ctx.settings)
    check_logprobs(body.logprobs, ctx.settings)
    max_tokens = body.max_tokens if body.max_tokens is not None else ctx.settings.default_max_tokens
    want_prompt_logprobs = body.echo and body.logprobs is not None
    jobs = []
    for prompt in prompts:
        for choice in range(body.n):
            sampling = sampling_request(body, ctx, cap_new_tokens(max_tokens, prompt, ctx.settings), choice,
                                        body.logprobs, want_prompt_logprobs)
            if body.suffix is not None:
                sampling = replace(sampling, stop_token_ids=fim_stop_ids(ctx.tokenizer, sampling.stop_token_ids))
            jobs.append(_Job(prompt, sampling.to_proto(f"{completion_id}-{len(jobs)}", prompt.ids)))
    return jobs, body.n


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request):
    """OpenAI completions; see docs/api.md."""
    ctx = get_ctx(request)
    ctx.check_model(body.model)
    completion_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    jobs, n = await _jobs(body, ctx, completion_id)
    head = {"id": completion_id, "object": "text_completion", "created": created, "model": ctx.settings.model_name}
    if body.stream:
        return await _stream(request, ctx, body, jobs, n, head)
    results = await collect_all(request, ctx, [job.request for job in jobs])
    choices = []
    for index, (job, result) in enumerate(zip(jobs, results)):
        state = _ChoiceState(ctx, body, job.prompt)
        text, logprobs = state.piece(result.as_message())
        choices.append({
            "index": index,
            "text": text,
            "logprobs": logprobs.as_dict() if logprobs is not None else None,
            "finish_reason": result.finish_reason,
        })
    return JSONResponse({**head, "choices": choices, "usage": usage(results, n), "system_fingerprint": None})


async def _stream(request: Request, ctx: GatewayContext, body: CompletionRequest, jobs: list[_Job], n: int,
                  head: dict) -> GuardedStreamingResponse:
    streams, firsts = await open_streams(request, ctx, [job.request for job in jobs])
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    states = [_ChoiceState(ctx, body, job.prompt) for job in jobs]

    async def events():
        prompt_tokens = [0] * len(jobs)
        cached_tokens = [0] * len(jobs)
        completion_tokens = [0] * len(jobs)
        async for index, msg in merge_streams(streams, firsts):
            if not states[index].started:
                prompt_tokens[index] = msg.prompt_tokens
                cached_tokens[index] = msg.cached_tokens
            text, logprobs = states[index].piece(msg)
            if msg.finish_reason:
                completion_tokens[index] = msg.completion_tokens
            if not text and not msg.finish_reason:  # no content chunk of empty text (the scheduler sends tokens
                continue                              # with their text: such a message has none)
            choice = {
                "index": index,
                "text": text,
                "logprobs": logprobs.as_dict() if logprobs is not None else None,
                "finish_reason": msg.finish_reason or None,
            }
            yield {**head, "choices": [choice], "usage": None}
        if include_usage:
            counts = usage_counts(sum(prompt_tokens[::n]), sum(completion_tokens), sum(cached_tokens[::n]))
            yield {**head, "choices": [], "usage": counts}

    return stream_response(ctx.metrics, streams, events())


def _model_card(ctx: GatewayContext) -> dict:
    return {
        "id": ctx.settings.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "codeserve",
        "max_model_len": ctx.settings.model.n_positions,
    }


@router.get("/v1/models")
async def list_models(request: Request):
    """The one served model."""
    return {"object": "list", "data": [_model_card(get_ctx(request))]}


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, request: Request):
    """The served model's card; 404 for any other name."""
    ctx = get_ctx(request)
    ctx.check_model(model)
    return _model_card(ctx)
