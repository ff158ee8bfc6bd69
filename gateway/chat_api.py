"""POST /v1/chat/completions (OpenAI chat), on top of the chat template in gateway.chat_template."""

from __future__ import annotations

import dataclasses
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from codeserve.v1 import scheduler_pb2
from gateway.chat_template import DEFAULT_STOPS, render
from gateway.context import GatewayContext, get_ctx
from gateway.errors import invalid
from gateway.fanout import collect_all, open_streams, stream_response
from gateway.generation import merge_streams
from gateway.openai_api import sampling_request, usage, usage_counts
from gateway.prompts import cap_new_tokens, check_logprobs, check_n, text_prompt
from gateway.schemas import ChatCompletionRequest

router = APIRouter()


def _chat_logprobs(ctx: GatewayContext, msg: scheduler_pb2.GenerateResponse, top_count: int) -> list[dict]:
    """OpenAI chat logprobs ``content`` entries for the tokens of ``msg``: ``token`` the token's text on its own (a
    piece of a multi-byte character renders as U+FFFD), ``bytes`` its real bytes (``GatewayTokenizer.token_bytes``:
    the bytes of a text's tokens joined are the text's UTF-8)."""
    if len(msg.logprobs) != len(msg.token_ids):
        raise ValueError(f"{len(msg.token_ids)} tokens but {len(msg.logprobs)} logprobs from the scheduler")
    out = []
    for i, token_id in enumerate(msg.token_ids):
        text = ctx.tokenizer.token_text(token_id)
        alternatives = []
        if top_count and i < len(msg.top_logprobs):
            for entry in msg.top_logprobs[i].entries[:top_count]:
                alt = ctx.tokenizer.token_text(entry.token_id)
                alternatives.append({"token": alt, "logprob": entry.logprob,
                                     "bytes": list(ctx.tokenizer.token_bytes(entry.token_id))})
        out.append({"token": text, "logprob": msg.logprobs[i], "bytes": list(ctx.tokenizer.token_bytes(token_id)),
                    "top_logprobs": alternatives})
    return out


async def _requests(body: ChatCompletionRequest, ctx: GatewayContext, chat_id: str) -> list[scheduler_pb2.GenerateRequest]:
    if (problem := body.unsupported()) is not None:
        raise invalid(problem[1], problem[0])
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
    check_logprobs(body.top_logprobs, ctx.settings, "top_logprobs")
    check_n(body.n, 1, ctx.settings)
    prompt = await text_prompt(render(body.messages, body.add_generation_prompt), ctx.tokenizer, ctx.settings, "messages")
    asked = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    max_tokens = cap_new_tokens(asked if asked is not None else ctx.settings.model.n_positions, prompt,
                                ctx.settings)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    requests = []
    for choice in range(body.n):
        sampling = sampling_request(body, ctx, max_tokens, choice, logprobs, False)
        sampling = dataclasses.replace(sampling, stop=sampling.stop + DEFAULT_STOPS)
        requests.append(sampling.to_proto(f"{chat_id}-{choice}", prompt.ids))
    return requests


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request):
    """OpenAI chat completions; see docs/api.md for the template."""
    ctx = get_ctx(request)
    ctx.check_model(body.model)
    chat_id = f"chatcmpl-{uuid.uuid4().hex}"
    requests = await _requests(body, ctx, chat_id)
    head = {"id": chat_id, "created": int(time.time()), "model": ctx.settings.model_name}
    top_count = body.top_logprobs or 0
    if body.stream:
        return await _stream(request, ctx, body, requests, head, top_count)
    results = await collect_all(request, ctx, requests)
    choices = []
    for index, result in enumerate(results):
        logprobs = None
        if body.logprobs:
            logprobs = {"content": _chat_logprobs(ctx, result.as_message(), top_count)}
        choices.append({"index": index, "message": {"role": "assistant", "content": result.text},
                        "logprobs": logprobs, "finish_reason": result.finish_reason})
    return JSONResponse({**head, "object": "chat.completion", "choices": choices,
                         "usage": usage(results, len(results)), "system_fingerprint": None})


async def _stream(request: Request, ctx: GatewayContext, body: ChatCompletionRequest,
                  requests: list[scheduler_pb2.GenerateRequest], head: dict, top_count: int):
    streams, firsts = await open_streams(request, ctx, requests)
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    chunk_head = {**head, "object": "chat.completion.chunk"}

    async def events():
        prompt_tokens = cached = 0
        completion = [0] * len(streams)
        for index, first in enumerate(firsts):
            if index == 0:
                prompt_tokens, cached = first.prompt_tokens, first.cached_tokens
            yield {**chunk_head, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                              "logprobs": None, "finish_reason": None}]}
        async for index, msg in merge_streams(streams, firsts):
            if msg.finish_reason:
                completion[index] = msg.completion_tokens
            if not msg.text and not msg.finish_reason:  # no content chunk of empty text (the scheduler sends
                continue                                  # tokens with their text: such a message has none)
            logprobs = {"content": _chat_logprobs(ctx, msg, top_count)} if body.logprobs else None
            delta = {"content": msg.text} if msg.text or not msg.finish_reason else {}
            yield {**chunk_head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                              "finish_reason": msg.finish_reason or None}]}
        if include_usage:
            yield {**chunk_head, "choices": [], "usage": usage_counts(prompt_tokens, sum(completion), cached)}

    return stream_response(ctx.metrics, streams, events())
