"""One Generate call to the scheduler, as the HTTP layer sees it: a stream of messages with gRPC
errors mapped to ApiError, and a frozen result when collected. The call's request metrics are kept by the
scheduler (scheduler_svc/request_metrics.py): an ApiError that the scheduler's outcome of the call carries is
marked ``counted_upstream`` so that the gateway does not count it again.

Cancelling (``GenerationStream.cancel`` or cancelling the task that reads it) cancels the gRPC call,
which aborts the request at the scheduler.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Iterable, TypeVar

import grpc
import structlog

from codeserve.v1 import common_pb2, scheduler_pb2
from common.counted import counted_by_scheduler
from common import hop_trace
from gateway.errors import ApiError
from gateway.scheduler_client import SchedulerClient
from gateway.stream_hooks import StreamHooks

T = TypeVar("T")
log = structlog.get_logger()
SETTLE_TIMEOUT_S = 5.0  # how long the scheduler may take to end a call after its last message
SIBLING_ABORT_TIMEOUT_S = 1.0  # how long a failed fan-out waits for the scheduler to take its siblings' abort reason

TopEntries = tuple[tuple[int, float], ...]  # (token_id, logprob) pairs, best first


@dataclass(frozen=True)
class SamplingRequest:
    """What one Generate call asks for, already validated and capped (max_new_tokens fits the context)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    return_prompt_logprobs: bool = False

    def to_proto(self, request_id: str, input_ids: Iterable[int]) -> scheduler_pb2.GenerateRequest:
        """The GenerateRequest for ``input_ids`` (tokenized by the gateway so counts agree)."""
        sampling = common_pb2.SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            has_seed=self.seed is not None,
            seed=self.seed if self.seed is not None else 0,
        )
        return scheduler_pb2.GenerateRequest(
            request_id=request_id,
            input_ids=scheduler_pb2.TokenIds(ids=list(input_ids)),
            sampling=sampling,
            max_new_tokens=self.max_new_tokens,
            stop=list(self.stop),
            stop_token_ids=list(self.stop_token_ids),
            ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            return_logprob=self.return_logprob,
            top_logprobs_num=self.top_logprobs_num,
            return_prompt_logprobs=self.return_prompt_logprobs,
            no_stop_trim=self.no_stop_trim,
        )


def _entries(tops) -> tuple[TopEntries, ...]:
    return tuple(tuple((e.token_id, e.logprob) for e in t.entries) for t in tops)


@dataclass(frozen=True)
class GenerationResult:
    """Everything one Generate call returned. Logprob tuples are aligned with their token tuples;
    prompt_logprobs has one entry per prompt token after the first (empty when not asked)."""

    request_id: str
    prompt_tokens: int
    cached_tokens: int
    prompt_logprobs: tuple[float, ...]
    prompt_top_logprobs: tuple[TopEntries, ...]
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...]
    top_logprobs: tuple[TopEntries, ...]
    finish_reason: str
    matched_stop: str
    completion_tokens: int

    def as_message(self) -> scheduler_pb2.GenerateResponse:
        """The whole result as one GenerateResponse, so streamed and whole answers share code paths."""

        def tops(entries: tuple[TopEntries, ...]) -> list[common_pb2.TopLogprobs]:
            return [common_pb2.TopLogprobs(entries=[common_pb2.TokenLogprob(token_id=t, logprob=lp) for t, lp in e])
                    for e in entries]

        return scheduler_pb2.GenerateResponse(
            request_id=self.request_id,
            token_ids=self.token_ids,
            text=self.text,
            logprobs=self.logprobs,
            top_logprobs=tops(self.top_logprobs),
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            prompt_logprobs=self.prompt_logprobs,
            prompt_top_logprobs=tops(self.prompt_top_logprobs),
            finish_reason=self.finish_reason,
            matched_stop=self.matched_stop,
            completion_tokens=self.completion_tokens,
        )


@dataclass
class ResultBuilder:
    """Accumulates the messages of one Generate call (``add``) into a GenerationResult (``build``)."""

    request_id: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prompt_logprobs: list[float] = field(default_factory=list)
    prompt_top_logprobs: list[TopEntries] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[TopEntries] = field(default_factory=list)
    finish_reason: str = ""
    matched_stop: str = ""
    completion_tokens: int = 0

    def add(self, msg: scheduler_pb2.GenerateResponse, first: bool) -> None:
        if first:
            self.request_id = msg.request_id
            self.prompt_tokens = msg.prompt_tokens
            self.cached_tokens = msg.cached_tokens
            self.prompt_logprobs = list(msg.prompt_logprobs)
            self.prompt_top_logprobs = list(_entries(msg.prompt_top_logprobs))
        self.token_ids.extend(msg.token_ids)
        self.text.append(msg.text)
        self.logprobs.extend(msg.logprobs)
        self.top_logprobs.extend(_entries(msg.top_logprobs))
        if msg.finish_reason:
            self.finish_reason = msg.finish_reason
            self.matched_stop = msg.matched_stop
            self.completion_tokens = msg.completion_tokens

    def build(self) -> GenerationResult:
        return GenerationResult(
            request_id=self.request_id,
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            prompt_logprobs=tuple(self.prompt_logprobs),
            prompt_top_logprobs=tuple(self.prompt_top_logprobs),
            token_ids=tuple(self.token_ids),
            text="".join(self.text),
            logprobs=tuple(self.logprobs),
            top_logprobs=tuple(self.top_logprobs),
            finish_reason=self.finish_reason,
            matched_stop=self.matched_stop,
            completion_tokens=self.completion_tokens,
        )


def _task_cancelled() -> bool:
    """True when the running task itself is being cancelled (not only a gRPC call it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class GenerationStream:
    """One in-flight Generate call.

    ``next()`` returns the next GenerateResponse, or None after the message that carries
    finish_reason. Raises ApiError for a gRPC error, for a stream that ends without finish_reason,
    and for finish_reason "abort" (the scheduler gave up on the request: 503). With ``hooks`` (a routed call),
    a failure before the first message may be retried once on the client ``hooks.failed`` returns.
    """

    def __init__(
        self,
        client: SchedulerClient,
        request: scheduler_pb2.GenerateRequest,
        retry_after_s: int,
        timeout_s: float | None = None,
        hooks: StreamHooks | None = None,
    ) -> None:
        self.request_id = request.request_id
        self._client = client
        self._request = request
        self._retry_after_s = retry_after_s
        self._timeout_s = timeout_s
        self._hooks = hooks
        self._call = client.start_generate(request, timeout_s)
        self._abandoned: ApiError | None = None
        client.streams.add(self)
        self._finished = False
        self._prompt_tokens = 0
        self._cached_tokens = 0
        self._first = True
        self._settling: asyncio.Future | None = None  # the wait for the call's status after its last message
        self._last_read = False  # a message with a finish_reason other than "abort" was read

    async def next(self) -> scheduler_pb2.GenerateResponse | None:
        if self._abandoned is not None and not self._finished:
            self._finished = True
            raise self._abandoned
        if self._finished:
            return None
        call = self._call
        try:
            msg = await call.read()
        except asyncio.CancelledError:
            if call is not self._call and not _task_cancelled():  # ``abandon`` moved the call to another replica
                return await self.next()
            if self._abandoned is None:
                raise
            self._finished = True
            raise self._abandoned from None
        except grpc.aio.AioRpcError as exc:
            error = self._client.error(exc)
            retry_on = self._hooks.failed(exc.code(), error, self._first) if self._hooks is not None else None
            if retry_on is not None:  # refused before its first message: once more, on the next-best replica
                self._move_to(retry_on)
                return await self.next()
            self._finished = True
            # the scheduler counted the call: it answered this status (its mark in the trailers), or the call
            # ended at the deadline, which the scheduler sees as its client leaving (finished_reason "abort")
            error.counted_upstream = (exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                                      or counted_by_scheduler(exc.trailing_metadata()))
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and self._timeout_s is not None:
                error.message = f"request did not finish within the gateway's request timeout ({self._timeout_s} s)"
            log.warning("request_failed", rid=self.request_id, grpc_code=exc.code().name, status=error.status,
                        error=error.message)
            raise error from exc
        if msg is grpc.aio.EOF:
            self._finished = True
            raise ApiError(500, f"scheduler stream for {self.request_id} ended without a finish_reason",
                           "internal_error")
        if self._first:
            self._first = False
            hop_trace.mark(self.request_id, "first_message")
            self._prompt_tokens, self._cached_tokens = msg.prompt_tokens, msg.cached_tokens
            if self._hooks is not None:
                self._hooks.first_message(msg)
        if msg.finish_reason:
            self._finished = True
            self._last_read = msg.finish_reason != "abort"
            hop_trace.mark(self.request_id, "last_message")
            log.info("request_finished", rid=self.request_id, prompt_tokens=self._prompt_tokens,
                     cached_tokens=self._cached_tokens, completion_tokens=msg.completion_tokens,
                     finish_reason=msg.finish_reason, matched_stop=msg.matched_stop)
            if msg.finish_reason == "abort":
                error = ApiError(503, f"request {self.request_id} was aborted by the scheduler",
                                 "service_unavailable", retry_after_s=self._retry_after_s)
                error.counted_upstream = True  # in request_success, finished_reason "abort"
                raise error
        return msg

    async def messages(self) -> AsyncIterator[scheduler_pb2.GenerateResponse]:
        """All remaining messages. When the iteration stops early (error, consumer gone, cancellation)
        the gRPC call is cancelled. After the last message the iteration ends at once (the answer's end, e.g.
        ``data: [DONE]``, does not wait for the call's status: at a c64 wave's end that status came ~7 ms after
        the last message, p50, H100 run 30) and the status is awaited in the background (``_settle``), so a
        finished request is never reported to the scheduler as cancelled: ``cancel`` leaves such a call alone."""
        try:
            while (msg := await self.next()) is not None:
                yield msg
        except BaseException:
            self.cancel()
            raise
        self._settle_later()

    def _settle_later(self) -> None:
        if self._settling is None:
            self._settling = asyncio.ensure_future(self._settle())

    async def _settle(self) -> None:
        # The scheduler ends the call right after the last message; cancel if it does not.
        try:
            await asyncio.wait_for(self._call.code(), SETTLE_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.warning("stream_not_closed", rid=self.request_id, waited_s=SETTLE_TIMEOUT_S)
            self._call.cancel()

    async def collect(self) -> GenerationResult:
        """Reads to the end and returns the result. The call is cancelled if this is cancelled."""
        builder = ResultBuilder()
        first = True
        async for msg in self.messages():
            builder.add(msg, first)
            first = False
        return builder.build()

    @property
    def finished(self) -> bool:
        """True once the call's last message or its error was read (or it was abandoned)."""
        return self._finished

    async def abort_as_sibling(self) -> None:
        """Tells the scheduler that this call ends because another call of the same HTTP request failed (an Abort
        RPC with ``sibling_failed``: counted apart from client aborts); the caller cancels it next. Raises
        ApiError when the Abort RPC fails."""
        await self._client.abort(self.request_id, sibling_failed=True)

    def cancel(self) -> None:
        """Cancels the gRPC call (no-op when it already finished). A call whose last message was read is not
        cancelled: its status is awaited in the background (``messages``), also when the answer ends before
        ``messages`` resumed after that message (the client left while the last event was sent, or the first message,
        read by ``open_streams``, was the last)."""
        if self._last_read:
            self._settle_later()
        else:
            self._call.cancel()
        self._client.streams.discard(self)
        if self._hooks is not None:
            self._hooks.ended()

    def _move_to(self, client: SchedulerClient) -> None:
        """Starts the same request on ``client`` (a retry on another replica); this stream reads from there."""
        self._client.streams.discard(self)
        self._client = client
        self._call = client.start_generate(self._request, self._timeout_s)
        client.streams.add(self)

    def abandon(self, error: ApiError) -> None:
        """Gives up on the call (the scheduler does not answer): cancels it; the pending or next ``next()``
        raises ``error``. A routed call that has read no message yet is retried instead, once, on the next
        replica its hooks name (as an UNAVAILABLE refusal is, ``dispatch.RouteHooks.failed``): the pending
        ``next()`` then reads from there."""
        if not self._finished and self._first and self._hooks is not None:
            retry_on = self._hooks.failed(grpc.StatusCode.UNAVAILABLE, error, True)
            if retry_on is not None:
                old = self._call
                self._move_to(retry_on)
                old.cancel()
                return
        if not self._finished:
            error.counted_upstream = True  # the frozen scheduler counts its call as "abort" when it sees the cancel
            self._abandoned = error
            log.warning("request_abandoned", rid=self.request_id, error=error.message)
        self.cancel()


async def abort_siblings(streams: Iterable[GenerationStream]) -> None:
    """Before a failed fan-out cancels its other calls: tells the scheduler why (``abort_as_sibling``) for each call
    still running, all at once, waiting at most SIBLING_ABORT_TIMEOUT_S. A failed or late Abort is logged and
    changes nothing else: the calls are cancelled all the same (the scheduler then counts them as client aborts)."""
    running = [s for s in streams if not s.finished]
    if not running:
        return
    try:
        outcomes = await asyncio.wait_for(asyncio.gather(*(s.abort_as_sibling() for s in running),
                                                         return_exceptions=True), SIBLING_ABORT_TIMEOUT_S)
    except asyncio.TimeoutError:
        log.warning("sibling_abort_timeout", rids=[s.request_id for s in running], waited_s=SIBLING_ABORT_TIMEOUT_S)
        return
    for stream, outcome in zip(running, outcomes):
        if isinstance(outcome, Exception):
            log.warning("sibling_abort_failed", rid=stream.request_id, error=repr(outcome))


async def gather_all(awaitables: Iterable[Awaitable[T]],
                     on_failure: Callable[[], Awaitable[None]] | None = None) -> list[T]:
    """Like asyncio.gather, but when one fails (or this is cancelled) the others are cancelled too; on a failure
    (not a cancellation) ``on_failure()`` is awaited first, while the others still run."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except Exception:
        if on_failure is not None:
            await on_failure()
        raise
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()


async def merge_streams(
    streams: list[GenerationStream], first: list[scheduler_pb2.GenerateResponse | None]
) -> AsyncIterator[tuple[int, scheduler_pb2.GenerateResponse]]:
    """Interleaves several streams as (stream index, message), starting with the already-read
    ``first`` messages (None = nothing read yet). Stops at the first error (raised here, after
    ``abort_siblings`` told the scheduler why the others end) and cancels every stream when the iteration ends
    for any reason."""
    queue: asyncio.Queue = asyncio.Queue()
    done_marker = object()

    async def pump(index: int, stream: GenerationStream) -> None:
        try:
            async for msg in stream.messages():
                await queue.put((index, msg, None))
            await queue.put((index, done_marker, None))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # forwarded to the consumer, which raises it
            await queue.put((index, None, exc))

    for index, msg in enumerate(first):
        if msg is not None:
            yield index, msg
    if len(streams) == 1:  # n = 1, the usual request: read it here, no pump task and queue hop per message
        try:
            async for msg in streams[0].messages():
                yield 0, msg
        except Exception:  # as the pump path: the scheduler is told, then the error reaches the consumer
            await abort_siblings(streams)
            raise
        finally:
            streams[0].cancel()
        return
    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            index, msg, exc = await queue.get()
            if exc is not None:
                await abort_siblings(streams)
                raise exc
            if msg is done_marker:
                remaining -= 1
                continue
            yield index, msg
    finally:
        for task in tasks:
            task.cancel()
        for stream in streams:
            stream.cancel()
