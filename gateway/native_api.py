"""SGLang-native endpoints: POST /generate, /tokenize, /detokenize."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from codeserve.v1 import scheduler_pb2
from gateway.chat_template import render
from gateway.context import GatewayContext, get_ctx
from gateway.errors import invalid
from gateway.fim import fim_prompts, fim_stop_ids
from gateway.fanout import collect_all, open_streams, stream_response
from gateway.generation import GenerationResult, ResultBuilder, SamplingRequest, merge_streams
from gateway.logprobs import prompt_logprob_lists
from gateway.prompts import (
    PromptInput, cap_new_tokens, check_ids, check_logprobs, parse_stop, parse_stop_token_ids, text_prompt,
)
from gateway.schemas import DetokenizeRequest, NativeGenerateRequest, NativeSamplingParams, TokenizeRequest

router = APIRouter()


async def _prompts(body: NativeGenerateRequest, ctx: GatewayContext) -> tuple[list[PromptInput], bool]:
    """The prompts and whether the request is a batch. Raises ApiError 400."""
    if (body.text is None) == (body.input_ids is None):
        raise invalid("give exactly one of text and input_ids", "text")
    if body.fim_mode is not None and body.suffix is None:
        raise invalid("fim_mode is only allowed with suffix", "fim_mode")
    if body.suffix is not None:
        if body.text is None:
            raise invalid("suffix needs text (the text before the cursor), not input_ids", "suffix")
        mode = body.fim_mode or "psm"
        return await fim_prompts(body.text, body.suffix, mode, ctx.tokenizer, ctx.settings, "text"), \
            isinstance(body.text, list)
    if body.text is not None:
        if isinstance(body.text, str):
            return [await text_prompt(body.text, ctx.tokenizer, ctx.settings, "text")], False
        texts = body.text
        if not texts:
            raise invalid("text is an empty list", "text")
        if len(texts) > ctx.settings.max_prompts:
            raise invalid(f"text has {len(texts)} prompts; the limit is {ctx.settings.max_prompts}", "text")
        return [await text_prompt(t, ctx.tokenizer, ctx.settings, f"text[{i}]") for i, t in enumerate(texts)], True
    ids = body.input_ids
    if ids and isinstance(ids[0], list):
        if len(ids) > ctx.settings.max_prompts:
            raise invalid(f"input_ids has {len(ids)} prompts; the limit is {ctx.settings.max_prompts}", "input_ids")
        return [PromptInput(None, check_ids(x, ctx.settings, f"input_ids[{i}]")) for i, x in enumerate(ids)], True
    return [PromptInput(None, check_ids(list(ids), ctx.settings, "input_ids"))], False


def _check_logprob_start(start: int, prompts: list[PromptInput], batch: bool, used: bool) -> None:
    """``logprob_start_len`` must be -1 (no prompt logprobs) or a prompt position; when ``used``
    (return_logprob) it must lie inside every prompt (0..len - 1). Raises ApiError 400 naming it (and the
    prompt and its length when past its end)."""
    if start < -1:
        raise invalid(f"logprob_start_len is {start}: give -1 (no prompt logprobs) or a prompt position "
                      f"0..prompt length - 1", "logprob_start_len")
    for i, prompt in enumerate(prompts if used else ()):
        if start >= len(prompt.ids):
            which = f"input_ids[{i}]" if batch and prompt.text is None else (
                f"text[{i}]" if batch else "the prompt")
            raise invalid(f"logprob_start_len is {start} but {which} has {len(prompt.ids)} tokens: give -1 or a "
                          f"position 0..{len(prompt.ids) - 1}", "logprob_start_len")


def _sampling(params: NativeSamplingParams, prompt: PromptInput, body: NativeGenerateRequest,
              ctx: GatewayContext) -> SamplingRequest:
    asked = params.max_new_tokens if params.max_new_tokens is not None else ctx.settings.native_default_max_new_tokens
    return SamplingRequest(
        max_new_tokens=cap_new_tokens(asked, prompt, ctx.settings),
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        repetition_penalty=params.repetition_penalty,
        frequency_penalty=params.frequency_penalty,
        presence_penalty=params.presence_penalty,
        seed=params.sampling_seed,
        stop=parse_stop(params.stop, ctx.settings, "sampling_params.stop"),
        stop_token_ids=parse_stop_token_ids(params.stop_token_ids, ctx.settings, "sampling_params.stop_token_ids"),
        ignore_eos=params.ignore_eos,
        skip_special_tokens=params.skip_special_tokens,
        no_stop_trim=params.no_stop_trim,
        return_logprob=body.return_logprob,
        top_logprobs_num=body.top_logprobs_num if body.return_logprob else 0,
        return_prompt_logprobs=body.return_logprob and body.logprob_start_len >= 0,
    )


async def _requests(body: NativeGenerateRequest, ctx: GatewayContext) -> tuple[list[scheduler_pb2.GenerateRequest], bool]:
    prompts, batch = await _prompts(body, ctx)
    check_logprobs(body.top_logprobs_num, ctx.settings, "top_logprobs_num")
    _check_logprob_start(body.logprob_start_len, prompts, batch, body.return_logprob)
    params = body.sampling_params if body.sampling_params is not None else NativeSamplingParams()
    if isinstance(params, list):
        if len(params) != len(prompts):
            raise invalid(f"sampling_params has {len(params)} entries for {len(prompts)} inputs", "sampling_params")
    else:
        params = [params] * len(prompts)
    rids = body.rid
    if rids is None:
        base = uuid.uuid4().hex
        rids = [f"{base}-{i}" for i in range(len(prompts))] if batch else [base]
    elif isinstance(rids, str):
        rids = [rids] if not batch else [f"{rids}-{i}" for i in range(len(prompts))]
    elif len(rids) != len(prompts):
        raise invalid(f"rid has {len(rids)} entries for {len(prompts)} inputs", "rid")
    samplings = [_sampling(p, prompt, body, ctx) for p, prompt in zip(params, prompts)]
    if body.suffix is not None:
        samplings = [replace(s, stop_token_ids=fim_stop_ids(ctx.tokenizer, s.stop_token_ids)) for s in samplings]
    requests = [s.to_proto(rid, prompt.ids) for s, prompt, rid in zip(samplings, prompts, rids)]
    return requests, batch


def _finish_reason(result: GenerationResult, request: scheduler_pb2.GenerateRequest) -> dict | None:
    if not result.finish_reason:
        return None
    if result.finish_reason == "length":
        return {"type": "length", "length": result.completion_tokens}
    matched: int | str = result.matched_stop
    if matched not in request.stop and result.matched_stop.isdigit():
        matched = int(result.matched_stop)
    return {"type": result.finish_reason, "matched": matched}


def _logprob_triples(ctx: GatewayContext, ids, logprobs, with_text: bool) -> list[list]:
    if len(ids) != len(logprobs):
        raise ValueError(f"{len(ids)} tokens but {len(logprobs)} logprobs from the scheduler")
    return [[lp, token_id, ctx.tokenizer.token_text(token_id) if with_text else None]
            for lp, token_id in zip(logprobs, ids)]


def _output(ctx: GatewayContext, body: NativeGenerateRequest, request: scheduler_pb2.GenerateRequest,
            result: GenerationResult, started: float, with_text: bool) -> dict:
    meta = {
        "id": request.request_id,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens if result.finish_reason else len(result.token_ids),
        "cached_tokens": result.cached_tokens,
        "finish_reason": _finish_reason(result, request),
        "e2e_latency": time.perf_counter() - started,
    }
    if body.return_logprob:
        if len(result.logprobs) != len(result.token_ids):
            raise ValueError(f"{len(result.token_ids)} tokens but {len(result.logprobs)} logprobs from the scheduler")
        meta["output_token_logprobs"] = _logprob_triples(ctx, result.token_ids, result.logprobs, with_text)
        if body.top_logprobs_num:
            meta["output_top_logprobs"] = [
                [[lp, t, ctx.tokenizer.token_text(t) if with_text else None] for t, lp in entries]
                for entries in result.top_logprobs
            ]
        if body.logprob_start_len >= 0:
            ids = list(request.input_ids.ids)
            lps, tops = prompt_logprob_lists(tuple(ids), result.prompt_logprobs, result.prompt_top_logprobs)
            start = body.logprob_start_len  # < len(ids): checked by _check_logprob_start
            meta["input_token_logprobs"] = _logprob_triples(ctx, ids[start:], lps[start:], with_text)
            if body.top_logprobs_num:
                tops = tops[start:]
                meta["input_top_logprobs"] = [
                    None if e is None else [[lp, t, ctx.tokenizer.token_text(t) if with_text else None] for t, lp in e]
                    for e in tops
                ]
    return {"text": result.text, "output_ids": list(result.token_ids), "meta_info": meta}


@router.post("/generate")
async def generate(body: NativeGenerateRequest, request: Request):
    """SGLang-native generation; see docs/api.md."""
    ctx = get_ctx(request)
    started = time.perf_counter()
    requests, batch = await _requests(body, ctx)
    with_text = body.return_text_in_logprobs
    if body.stream:
        return await _stream(request, ctx, body, requests, batch, started, with_text)
    results = await collect_all(request, ctx, requests)
    outputs = [_output(ctx, body, r, res, started, with_text) for r, res in zip(requests, results)]
    return JSONResponse(outputs if batch else outputs[0])


async def _stream(request: Request, ctx: GatewayContext, body: NativeGenerateRequest,
                  requests: list[scheduler_pb2.GenerateRequest], batch: bool, started: float, with_text: bool):
    streams, firsts = await open_streams(request, ctx, requests)
    builders = [ResultBuilder() for _ in requests]
    seen = [False] * len(requests)

    async def events():
        async for index, msg in merge_streams(streams, firsts):
            builders[index].add(msg, not seen[index])
            seen[index] = True
            output = _output(ctx, body, requests[index], builders[index].build(), started, with_text)
            if batch:
                output["index"] = index
            yield output

    return stream_response(ctx.metrics, streams, events())


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request):
    """Token ids of ``prompt`` (or of ``messages`` rendered with the chat template)."""
    ctx = get_ctx(request)
    ctx.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise invalid("give exactly one of prompt and messages", "prompt")
    if body.messages is not None and not body.messages:
        raise invalid("messages is an empty list: give at least one message", "messages")
    text = body.prompt if body.prompt is not None else render(body.messages, body.add_generation_prompt)
    ids = await ctx.tokenizer.encode_async(text)
    return {"tokens": ids, "count": len(ids), "max_model_len": ctx.settings.model.n_positions}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request):
    """Text of ``tokens`` (no clean-up of tokenization spaces)."""
    ctx = get_ctx(request)
    ctx.check_model(body.model)
    limit = ctx.tokenizer.vocab_size
    for i, token_id in enumerate(body.tokens):
        if token_id < 0 or token_id >= limit:
            raise invalid(f"tokens has id {token_id} at position {i}; the tokenizer knows ids [0, {limit})", "tokens")
    return {"prompt": ctx.tokenizer.decode(body.tokens, body.skip_special_tokens)}
