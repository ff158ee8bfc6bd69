"""The Scheduler gRPC servicer: a thin layer over scheduler.Scheduler."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
from tokenizers import Tokenizer

from codeserve.v1 import cache_pb2, scheduler_pb2, scheduler_pb2_grpc
from common.counted import COUNTED_MARK
from common import hop_trace
from scheduler_svc.errors import DependencyError, DependencyUnavailable, SessionLost, WorkerStalled
from scheduler_svc.group_admission import GroupAdmission
from scheduler_svc.output import OutputStream
from scheduler_svc.request import SIBLING_FAILED, Finish, StreamEnd
from scheduler_svc.request_metrics import RequestMetrics
from scheduler_svc.intake import QueueFull, SchedulerStopped
from scheduler_svc.scheduler import Scheduler
from scheduler_svc.stream_queue import LoopQueue
from scheduler_svc.validate import InvalidRequest, build_request

SERVICE_NAME = "codeserve.v1.Scheduler"
# GetLoad's deadline per GetPool try (a dead cache: + ~1.6 s of rpc.call retries), inside the gateway's own
POOL_READ_TIMEOUT_S = 1.0


def pool_counters(pool: cache_pb2.PoolStatus) -> scheduler_pb2.PoolCounters:
    c = pool.counters
    return scheduler_pb2.PoolCounters(pool_id=pool.pool_id, capacity=c.capacity, available=c.available,
                                      evictable=c.evictable, protected=c.protected, owned=c.owned)


class _Refused(Exception):
    """A Generate call that cannot be queued: the status to end it with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    """Generate streams from a request's queue, fed by the loop; a client that goes away aborts its request. For a
    grpc.aio server (``common/aio_server.py``): Generate runs on its event loop, the other methods on its thread pool."""

    def __init__(self, scheduler: Scheduler, tokenizer: Tokenizer, log, max_queued_tokens: int = 0,
                 metrics: RequestMetrics | None = None) -> None:
        """``max_queued_tokens``: bound on the prompt tokens waiting (0 = none); a request that would pass it while
        others wait is RESOURCE_EXHAUSTED (a request alone in the queue is always taken, so any valid one can run; the
        calls of one HTTP request are one request here: ``group_admission.py``).
        ``metrics``: where every Generate call is counted (a new RequestMetrics when None)."""
        self.sched, self.tok, self.log = scheduler, tokenizer, log
        self.metrics = metrics if metrics is not None else RequestMetrics()
        self.max_queued_tokens = max_queued_tokens
        self.groups = GroupAdmission()  # a prompt list's / n > 1's calls queued or refused together
        self.draining = threading.Event()
        self._open = 0  # Generate calls whose handler has not returned (``open_calls``)
        self._open_changed = threading.Condition()

    def open_calls(self) -> int:
        """Generate calls whose handler has not returned yet (their last message or status not handed to gRPC)."""
        with self._open_changed:
            return self._open

    def wait_calls_ended(self, timeout_s: float) -> bool:
        """Blocks until every Generate handler returned, at most ``timeout_s`` seconds; True when they all did. The
        scheduler's shutdown waits for this after ending the streams (``Scheduler.stop``) and before the server
        stops: a server that stops refuses new calls at once, the gateway's health probe among them, and a gateway
        that sees the probe fail first abandons the streams with the probe's reason instead of their own ("shutting
        down"): the race of tests/reliability/test_drain.py in session 23's CI."""
        with self._open_changed:
            return self._open_changed.wait_for(lambda: self._open == 0, timeout_s)

    async def Generate(self, request, context):
        """Streams one request's messages. Runs on the gRPC server's event loop (``common/aio_server.py``), as every
        open stream does: the loop's messages reach it through a ``LoopQueue`` (``stream_queue.py``). Its set-up
        (validation, tokenizing, ``submit``) runs on that loop too, with no await: it never waits on a peer."""
        # counted exactly once however the call ends (scheduler_svc/request_metrics.py); a health probe not at all
        call = self.metrics.call(request.health_probe)
        with self._open_changed:
            self._open += 1
        try:
            try:
                req, log = self._start(request, context, call, LoopQueue(asyncio.get_running_loop()))
            except _Refused as refused:
                await self._abort(context, call, refused.code, refused.message)
            log.info("generate", prompt_tokens=len(req.prompt_ids), max_new_tokens=req.params.max_new_tokens)
            while True:
                item = await req.out.get()
                if isinstance(item, StreamEnd):
                    if item.code is not None:
                        log.warning("generate_failed", code=item.code.name, error=item.message)
                        await self._abort(context, call, item.code, item.message)
                    return
                call.on_message(item)
                hop_trace.mark(req.rid, "first_yield")
                if item.finish_reason:
                    hop_trace.mark(req.rid, "last_yield")
                yield item
        except Exception:  # _abort's own exception too (it counted its code: failed() is then a no-op)
            call.failed(grpc.StatusCode.UNKNOWN.name)  # a fault in this servicer: gRPC answers UNKNOWN
            context.set_trailing_metadata((COUNTED_MARK,))  # counted here: the gateway must not count it again
            raise
        finally:  # a cancelled call (its client left) too: asyncio.CancelledError is no Exception
            call.closed()
            with self._open_changed:
                self._open -= 1
                self._open_changed.notify_all()

    @staticmethod
    async def _abort(context, call, code: grpc.StatusCode, message: str) -> None:
        """Ends the call with ``code``, counted; the trailer tells the gateway not to count it again. Raises
        (grpc.aio's AbortError) as ``context.abort`` does."""
        call.failed(code.name)
        context.set_trailing_metadata((COUNTED_MARK,))
        await context.abort(code, message)

    def _start(self, request, context, call, out: LoopQueue):
        """Validates, builds and queues the request (``call``: its metrics), its messages to ``out``; returns (Req,
        bound logger). Raises _Refused (the status to end the call with) when it cannot be queued."""
        hop_trace.mark(request.request_id, "generate")
        info = self.sched.info
        if self.draining.is_set():
            raise _Refused(grpc.StatusCode.UNAVAILABLE, "scheduler is shutting down")
        try:
            req = build_request(request, self.tok, info, self.sched.capacity)
        except InvalidRequest as exc:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        req.out = out
        req.stream = OutputStream(req, self.tok, info.eos_token_id, outbox=self.sched.outbox)
        call.sibling_abort = lambda: req.abort_reason == SIBLING_FAILED  # read if the call ends as an abort
        log = self.log.bind(rid=req.rid)
        if req.params.max_new_tokens == 0 and not req.wants_prompt_logprobs:
            req.stream.finish_without_token(Finish.LENGTH)
            req.stream.close()
            return req, log
        req.over_limits = self.groups.joins(request.group_id, request.group_size)
        if not req.over_limits:
            self._check_queued_tokens(req)
        try:
            self.sched.submit(req)
            if not req.over_limits:
                self.groups.queued_first(request.group_id, request.group_size)
        except QueueFull as exc:
            raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from exc
        except (SchedulerStopped, WorkerStalled) as exc:
            raise _Refused(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
        except ValueError as exc:
            raise _Refused(grpc.StatusCode.ALREADY_EXISTS, str(exc)) from exc
        # at the call's end however it ends (its client left: the request is aborted; ended: a no-op)
        context.add_done_callback(lambda _: self.sched.abort(req.rid, "client disconnected"))
        return req, log

    def _check_queued_tokens(self, req) -> None:
        if not self.max_queued_tokens:
            return
        _, waiting, tokens = self.sched.queue_lengths()
        if waiting and tokens + len(req.prompt_ids) > self.max_queued_tokens:
            raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"waiting queue is full: {waiting} requests with {tokens} tokens wait, and this request's "
                           f"{len(req.prompt_ids)} prompt tokens would pass the limit of {self.max_queued_tokens} "
                           f"queued tokens")

    def Abort(self, request, context):
        reason = SIBLING_FAILED if request.sibling_failed else "Abort RPC"
        return scheduler_pb2.AbortResponse(found=self.sched.abort(request.request_id, reason))

    def _pool(self, context) -> cache_pb2.PoolStatus:
        """This scheduler's pool status from the cache; a failure answers UNAVAILABLE naming the cause."""
        try:
            return self.sched.cache.get_pool()
        except (DependencyUnavailable, DependencyError, SessionLost) as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    def GetLoad(self, request, context):
        """The scheduler's own numbers, and the pool's counters from the cache; a cache that does not answer within
        POOL_READ_TIMEOUT_S leaves ``pools`` empty and names why in ``pool_error`` (the rest stands). With a
        ``router_id``, ``others``: the load of the calls that router did not send."""
        running, waiting, waiting_tokens = self.sched.queue_lengths()
        s = self.sched.stats
        try:
            pools, pool_error = [pool_counters(self.sched.cache.get_pool(POOL_READ_TIMEOUT_S))], ""
        except (DependencyUnavailable, DependencyError, SessionLost) as exc:
            pools, pool_error = [], str(exc)
        others = None
        if request.router_id:
            live, waiting_others, tokens_others = self.sched.load_of_others(request.router_id)
            others = scheduler_pb2.CallLoad(live=live, waiting=waiting_others, waiting_tokens=tokens_others)
        return scheduler_pb2.GetLoadResponse(
            others=others, running=running, waiting=waiting, waiting_tokens=waiting_tokens, pools=pools, pool_error=pool_error,
            seconds_since_last_batch=time.monotonic() - self.sched.last_batch_at, batches_completed=s["batches"],
            prefix_query_tokens=s["prefix_query"], prefix_hit_tokens=s["prefix_hit"],
            prompt_tokens_total=s["prompt_tokens"], generation_tokens_total=s["generation_tokens"],
            unhealthy_reason=self.sched.unhealthy_reason(), outage_reason=self.sched.outage_reason(),
            request_metrics=self.metrics.render() + self.sched.metrics_text() if request.request_metrics else "")

    def FlushCache(self, request, context):
        try:
            freed = self.sched.cache.flush().freed_tokens
        except (DependencyUnavailable, DependencyError, SessionLost) as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        self.log.info("flush_cache", freed_tokens=freed)
        return scheduler_pb2.FlushCacheResponse(freed_tokens=freed)

    def ServerInfo(self, request, context):
        info, cfg = self.sched.info, self.sched.cfg
        return scheduler_pb2.ServerInfoResponse(
            model_name=info.model_name, model_path=info.model_path, n_positions=info.n_positions,
            vocab_size=info.vocab_size, eos_token_id=info.eos_token_id, max_running_requests=cfg.max_running_requests,
            chunk_size=cfg.chunk_size, page_size=info.page_size, max_queued_requests=cfg.max_queued_requests,
            pools=[pool_counters(self._pool(context))], attention_backend=info.attention_backend,
            device=info.device, dtype=info.dtype)
