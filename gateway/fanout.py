"""Running several Generate calls for one HTTP request (a batch of prompts, n > 1), tied to the
client connection: a disconnect or an error in one call cancels them all (after an error, the scheduler is first
told that the others end because a sibling failed: ``generation.abort_siblings``); a streamed answer is one
server-sent-events response over the opened streams."""

from __future__ import annotations

import uuid
from typing import AsyncIterator

from fastapi import Request

from codeserve.v1 import scheduler_pb2
from common import hop_trace
from gateway.context import GatewayContext
from gateway.disconnect import GuardedStreamingResponse, error_event, sse, until_disconnect
from gateway.errors import ApiError
from gateway.generation import GenerationResult, GenerationStream, abort_siblings, gather_all
from gateway.metrics import GatewayMetrics
from gateway.middleware import HTTP_IN


def as_group(requests: list[scheduler_pb2.GenerateRequest]) -> None:
    """Marks the calls of one HTTP request with several generations as one group (``group_id``, new for each HTTP
    request, and ``group_size``): the scheduler applies its queue limits to the group's first call and queues the
    others with it (scheduler_svc/group_admission.py). One call: left as is."""
    if len(requests) > 1:
        group_id = uuid.uuid4().hex
        for r in requests:
            r.group_id, r.group_size = group_id, len(requests)


async def _start(ctx: GatewayContext, request: scheduler_pb2.GenerateRequest) -> GenerationStream:
    return await ctx.dispatcher.start(request, ctx.settings.retry_after_s, ctx.settings.request_timeout_s)


async def collect_all(
    http_request: Request, ctx: GatewayContext, requests: list[scheduler_pb2.GenerateRequest]
) -> list[GenerationResult]:
    """Runs every request to the end, results in order. Raises ApiError (the first failure; the
    other calls are cancelled) or ClientDisconnected (all calls cancelled)."""
    streams: list[GenerationStream] = []
    as_group(requests)

    async def run() -> list[GenerationResult]:
        try:
            for r in requests:
                streams.append(await _start(ctx, r))
            return await gather_all((s.collect() for s in streams), lambda: abort_siblings(streams))
        finally:
            for stream in streams:
                stream.cancel()

    return await until_disconnect(http_request, run())


async def open_streams(
    http_request: Request, ctx: GatewayContext, requests: list[scheduler_pb2.GenerateRequest]
) -> tuple[list[GenerationStream], list[scheduler_pb2.GenerateResponse | None]]:
    """Starts every request and waits for each one's first message, so that errors the scheduler
    reports up front (invalid input, overload) become an HTTP status instead of an error event in
    a stream that already answered 200. Raises ApiError or ClientDisconnected, cancelling all calls.
    The caller owns the returned streams and must cancel them when done."""
    streams: list[GenerationStream] = []
    as_group(requests)
    try:
        for r in requests:  # a refusal part-way (scheduler known down) cancels those already started
            if HTTP_IN in http_request.scope:
                hop_trace.mark(r.request_id, "http_in", http_request.scope[HTTP_IN])
            hop_trace.mark(r.request_id, "call")
            streams.append(await _start(ctx, r))
        firsts = await until_disconnect(http_request, gather_all((s.next() for s in streams),
                                                                  lambda: abort_siblings(streams)))
    except BaseException:
        for stream in streams:
            stream.cancel()
        raise
    return streams, firsts


def stream_response(metrics: GatewayMetrics, streams: list[GenerationStream],
                    payloads: AsyncIterator[dict]) -> GuardedStreamingResponse:
    """The server-sent-events answer over ``streams`` (from ``open_streams``): each dict ``payloads`` yields is one
    event; an exception it raises becomes an error event (the 200 is already sent: an ApiError's OpenAI body, any
    other a 500 internal_error), counted in ``metrics``' ``codeserve:request_errors`` unless the scheduler counted
    that outcome of its call (``counted_upstream``); then ``data: [DONE]``. Every stream's call is cancelled
    however the response ends (finished, client gone, error), even if ``payloads`` never started."""

    async def events() -> AsyncIterator[str]:
        try:
            async for payload in payloads:
                if hop_trace.enabled():
                    for stream in streams:
                        hop_trace.mark(stream.request_id, "first_chunk")
                yield sse(payload)
        except Exception as exc:  # reported to the client as an error event, then the stream ends
            body = error_event(exc)
            if not (isinstance(exc, ApiError) and exc.counted_upstream):  # e.g. the scheduler died, a gateway fault
                metrics.count_error(body["error"]["code"], body["error"]["type"])
            yield sse(body)
        if hop_trace.enabled():
            for stream in streams:
                hop_trace.mark(stream.request_id, "done_chunk")
        yield sse("[DONE]")

    def close() -> None:
        for stream in streams:
            stream.cancel()

    return GuardedStreamingResponse(events(), close)
