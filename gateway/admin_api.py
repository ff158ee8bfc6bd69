"""Operational endpoints: /health, /health_generate, /server_info, /flush_cache, /metrics."""

from __future__ import annotations

import asyncio
import uuid

import grpc
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from grpc_health.v1 import health_pb2
from prometheus_client import CONTENT_TYPE_LATEST

from codeserve.v1 import scheduler_pb2
from gateway import replica_admin
from gateway.context import get_ctx
from gateway.errors import ApiError
from gateway.generation import SamplingRequest
from gateway.readiness import not_serving_reason
from gateway.scheduler_client import SchedulerClient

router = APIRouter()


@router.get("/health")
async def health():
    """Liveness only: the HTTP server is up. Use /health_generate for readiness and progress."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(request: Request):
    """Cheap readiness: the scheduler answers grpc.health.v1 with SERVING within ``probe_timeout_s`` and its GetLoad
    names no outage (its worker or cache unreachable: it would only queue the request, or fail it fast). 200
    ``{"status": "ok"}``, or 503 with Retry-After naming why (unreachable, NOT_SERVING, the outage, GetLoad's own
    failure). Was: health alone, so /ready said 200 through a worker outage once the requests in flight had failed
    (no work left, so no progress timeout) while every new request got a 503 (a fresh helper's SIGKILL with the
    launcher stopped)."""
    ctx = get_ctx(request)
    if not ctx.replicas.single:
        return await replica_admin.ready(ctx)
    retry = ctx.settings.retry_after_s
    try:
        status = await ctx.client.probe(ctx.settings.probe_timeout_s)
    except grpc.aio.AioRpcError as exc:
        raise ApiError(503, f"scheduler at {ctx.client.target} did not answer its health check within "
                            f"{ctx.settings.probe_timeout_s} s: {exc.code().name}", "service_unavailable",
                       retry_after_s=retry) from exc
    ctx.client.down = None  # it answered: new requests need not wait for the next background probe
    if status != health_pb2.HealthCheckResponse.SERVING:
        raise await _not_serving(ctx, status)
    try:
        outage = (await ctx.client.get_load()).outage_reason
    except ApiError as exc:
        raise ApiError(503, f"scheduler health is SERVING, but its load could not be read: GetLoad answered "
                            f"{exc.status} {exc.message}", "service_unavailable", retry_after_s=retry) from exc
    if outage:
        raise ApiError(503, f"the scheduler at {ctx.client.target} reports an outage: {outage}", "service_unavailable",
                       retry_after_s=retry)
    return {"status": "ok"}


async def _not_serving(ctx, status: int, client: SchedulerClient | None = None) -> ApiError:
    """The 503 for a scheduler whose health is ``status`` (not SERVING), naming why (``not_serving_reason``: its
    GetLoad's reason, or GetLoad's own failure; the 503 stands either way)."""
    return ApiError(503, f"scheduler health is {await not_serving_reason(client or ctx.client, status)}",
                    "service_unavailable", retry_after_s=ctx.settings.retry_after_s)


@router.get("/health_generate")
async def health_generate(request: Request):
    """Readiness and progress: the scheduler's gRPC health must be SERVING and a real one-token
    generation must round-trip through scheduler and worker within ``health_timeout_s``.
    200 ``{"status": "ok", ...}`` or 503 with the OpenAI error body naming the failure."""
    ctx = get_ctx(request)
    if not ctx.replicas.single:
        return await replica_admin.health_generate(ctx, lambda r: _health_generate(ctx, r.client))
    return await _health_generate(ctx, ctx.client)


async def _health_generate(ctx, client: SchedulerClient) -> dict:
    """The round trip on one scheduler (``client``); raises ApiError 503 naming the failure."""
    timeout = ctx.settings.health_timeout_s
    retry = ctx.settings.retry_after_s

    async def probe() -> dict:
        status = await client.health_status()
        if status != health_pb2.HealthCheckResponse.SERVING:
            raise await _not_serving(ctx, status, client)
        prompt = ctx.tokenizer.encode("def")
        req = SamplingRequest(max_new_tokens=1, temperature=0.0).to_proto(f"health-{uuid.uuid4().hex}", prompt)
        req.namespace = "__health_generate__"
        req.health_probe = True  # kept out of the request metrics and token counters (SGLang: log_metrics=False)
        call = client.start_generate(req, timeout_s=timeout)
        tokens = 0
        finish = ""
        try:
            async for msg in call:
                tokens += len(msg.token_ids)
                finish = msg.finish_reason or finish
        except grpc.aio.AioRpcError as exc:
            error = client.error(exc)
            raise ApiError(503, f"health generation failed: {error.message}", "service_unavailable",
                           retry_after_s=retry) from exc
        finally:
            call.cancel()
        if tokens != 1 or not finish:
            raise ApiError(503, f"health generation returned {tokens} tokens, finish_reason {finish!r} "
                                f"(expected 1 token and a finish_reason)", "service_unavailable",
                           retry_after_s=retry)
        return {"status": "ok", "tokens": tokens, "finish_reason": finish}

    try:
        return await asyncio.wait_for(probe(), timeout)
    except asyncio.TimeoutError:
        raise ApiError(503, f"health generation did not finish within {timeout} s", "service_unavailable",
                       retry_after_s=retry) from None
    except ApiError as exc:
        if exc.status == 503:
            raise
        raise ApiError(503, f"health check failed: {exc.message}", "service_unavailable",
                       retry_after_s=retry) from exc


def _pool(pool: scheduler_pb2.PoolCounters) -> dict:
    return {
        "pool_id": pool.pool_id,
        "capacity": pool.capacity,
        "available": pool.available,
        "evictable": pool.evictable,
        "protected": pool.protected,
        "owned": pool.owned,
    }


@router.get("/get_model_info")
async def get_model_info(request: Request):
    """SGLang's model info: the served name and the tokenizer/model facts the gateway uses."""
    ctx = get_ctx(request)
    return {"model_path": ctx.settings.model_name, "tokenizer_path": ctx.settings.model_name, "is_generation": True,
            "max_model_len": ctx.settings.model.n_positions, "vocab_size": ctx.settings.model.vocab_size}


@router.get("/server_info")
@router.get("/get_server_info")
async def server_info(request: Request):
    """Model, limits, scheduler load and per-pool counters (from ServerInfo and GetLoad)."""
    ctx = get_ctx(request)
    if not ctx.replicas.single:
        return await replica_admin.server_info(ctx, lambda info: _info(ctx, info), _load, _pool)
    info, load = await asyncio.gather(ctx.client.server_info(), ctx.client.get_load())
    if load.pool_error:
        raise ApiError(503, f"the scheduler could not read its KV pool from the cache: {load.pool_error}",
                       "service_unavailable", retry_after_s=ctx.settings.retry_after_s)
    return {**_info(ctx, info), "load": _load(load), "pools": [_pool(p) for p in load.pools]}


def _info(ctx, info: scheduler_pb2.ServerInfoResponse) -> dict:
    s = ctx.settings
    return {
        "model_name": s.model_name,
        "scheduler_model_name": info.model_name,
        "model_path": info.model_path,
        "n_positions": info.n_positions,
        "vocab_size": info.vocab_size,
        "eos_token_id": info.eos_token_id,
        "max_running_requests": info.max_running_requests,
        "max_queued_requests": info.max_queued_requests,
        "chunk_size": info.chunk_size,
        "page_size": info.page_size,
        "attention_backend": info.attention_backend,
        "device": info.device,
        "dtype": info.dtype,
        "gateway_limits": {
            "max_body_bytes": s.max_body_bytes,
            "max_n": s.max_n,
            "max_prompts": s.max_prompts,
            "max_stop_strings": s.max_stop_strings,
            "max_stop_chars": s.max_stop_chars,
            "max_logprobs": s.max_logprobs,
        },
    }


def _load(load: scheduler_pb2.GetLoadResponse) -> dict:
    return {
        "running": load.running,
        "waiting": load.waiting,
        "waiting_tokens": load.waiting_tokens,
        "seconds_since_last_batch": load.seconds_since_last_batch,
        "batches_completed": load.batches_completed,
    }


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request):
    """Evicts every unlocked cached prefix (of every replica); returns how many tokens were freed."""
    ctx = get_ctx(request)
    if not ctx.replicas.single:
        return await replica_admin.flush_cache(ctx)
    reply = await ctx.client.flush_cache()
    return JSONResponse({"freed_tokens": reply.freed_tokens})


@router.get("/metrics")
async def metrics(request: Request):
    """Prometheus text format (see gateway.metrics for the names)."""
    ctx = get_ctx(request)
    if not ctx.replicas.single:
        return Response(ctx.metrics.render_replicas(await replica_admin.metrics_loads(ctx)),
                        media_type=CONTENT_TYPE_LATEST)
    try:
        load = await ctx.client.get_load(request_metrics=True)
    except ApiError:
        load = None  # reported as codeserve:scheduler_up 0, scheduler families left out
    return Response(ctx.metrics.render(load), media_type=CONTENT_TYPE_LATEST)
