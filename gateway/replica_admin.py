"""The operational endpoints of a gateway of several replicas (gateway.admin_api calls these; with one replica it
answers as it always did). Every replica is asked at once; each answer lists every replica (``replicas``: its
name "r0"..., scheduler, cache and pool addresses, and its state or what it answered):

- ``/ready``: 200 while at least one replica's scheduler answers SERVING, else 503 (with Retry-After);
- ``/health_generate``: a one-token round trip on every replica; 200 while one succeeds;
- ``/server_info``: the model facts (from the first replica that answered), per-replica load and pools, and totals;
  503 when no replica answered;
- ``/flush_cache``: every replica's pool; 200 with each one's freed tokens, 503 naming those that failed.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, TypeVar

import grpc
from fastapi.responses import JSONResponse
from grpc_health.v1 import health_pb2

from codeserve.v1 import scheduler_pb2
from gateway.context import GatewayContext
from gateway.errors import ApiError
from gateway.readiness import not_serving_reason
from gateway.replicas import Replica

T = TypeVar("T")
SERVING = health_pb2.HealthCheckResponse.SERVING


def _where(r: Replica) -> dict:
    return {"replica": r.name, "scheduler": r.spec.scheduler, "cache": r.spec.cache, "pool": r.spec.pool}


def _answer(ctx: GatewayContext, ok: bool, message: str, replicas: list[dict], extra: dict | None = None):
    """200 ``{"status": "ok", **extra, "replicas": [...]}`` or 503 with the OpenAI error body and the list."""
    if ok:
        return {"status": "ok", **(extra or {}), "replicas": replicas}
    error = ApiError(503, message, "service_unavailable", retry_after_s=ctx.settings.retry_after_s)
    return JSONResponse({**error.body(), "replicas": replicas}, status_code=503,
                        headers={"Retry-After": str(ctx.settings.retry_after_s)})


async def _each(ctx: GatewayContext, ask: Callable[[Replica], Awaitable[T]]) -> list[T | Exception]:
    return await asyncio.gather(*(ask(r) for r in ctx.replicas.replicas), return_exceptions=True)


async def ready(ctx: GatewayContext):
    """Each replica's health, probed now (a scheduler that answers is reachable again at once)."""

    async def ask(r: Replica) -> dict:
        try:
            status = await r.client.probe(ctx.settings.probe_timeout_s)
        except grpc.aio.AioRpcError as exc:
            return {**_where(r), "state": "unreachable",
                    "reason": f"no answer to its health check within {ctx.settings.probe_timeout_s} s: "
                              f"{exc.code().name}"}
        r.client.down = None
        if r.watch is not None:
            r.watch.last_status = status
        if status != SERVING:  # with the scheduler's reason, as one scheduler's /ready (was: the status alone)
            return {**_where(r), "state": "not_serving", "reason": await not_serving_reason(r.client, status)}
        if r.excluded is not None:
            return {**_where(r), "state": "excluded", "reason": r.excluded}
        if r.load.outage:
            return {**_where(r), "state": "outage", "reason": r.load.outage}
        return {**_where(r), "state": "ready"}

    states = await _each(ctx, ask)
    ok = any(s["state"] == "ready" for s in states)
    why = "; ".join(f"{s['replica']}: {s['state']} ({s.get('reason', '')})" for s in states)
    return _answer(ctx, ok, f"no replica is ready: {why}", states)


async def health_generate(ctx: GatewayContext, one: Callable[[Replica], Awaitable[dict]]):
    """``one(replica)`` is the single-scheduler round trip (raises ApiError); 200 while one replica passes."""

    async def ask(r: Replica) -> dict:
        try:
            return {**_where(r), "state": "ok", **(await one(r))}
        except ApiError as exc:
            return {**_where(r), "state": "failed", "reason": exc.message}

    states = await _each(ctx, ask)
    ok = any(s["state"] == "ok" for s in states)
    why = "; ".join(f"{s['replica']}: {s['reason']}" for s in states if s["state"] != "ok")
    return _answer(ctx, ok, f"no replica passed the health generation: {why}", states)


async def server_info(ctx: GatewayContext, info_body: Callable, load_body: Callable, pool_body: Callable):
    """``info_body(info)``, ``load_body(load)`` and ``pool_body(pool)`` are the single-scheduler answer's parts."""

    async def ask(r: Replica):
        return await asyncio.gather(r.client.server_info(), r.client.get_load())

    answers = await _each(ctx, ask)
    replicas, loads, first_info = [], [], None
    for r, answer in zip(ctx.replicas.replicas, answers):
        if isinstance(answer, ApiError):
            replicas.append({**_where(r), "state": "unreachable", "reason": answer.message})
            continue
        if isinstance(answer, Exception):
            raise answer
        info, load = answer
        first_info = first_info or info
        loads.append(load)
        state, reason = r.condition()
        entry = {**_where(r), "state": state, **({"reason": reason} if reason else {}), "load": load_body(load),
                 "pools": [pool_body(p) for p in load.pools], "device": info.device,
                 "max_running_requests": info.max_running_requests}
        if load.pool_error:
            entry["pool_error"] = load.pool_error
        replicas.append(entry)
    if first_info is None:
        why = "; ".join(f"{e['replica']}: {e['reason']}" for e in replicas)
        raise ApiError(503, f"no replica answered: {why}", "service_unavailable",
                       retry_after_s=ctx.settings.retry_after_s)
    total = scheduler_pb2.GetLoadResponse(
        running=sum(ld.running for ld in loads), waiting=sum(ld.waiting for ld in loads),
        waiting_tokens=sum(ld.waiting_tokens for ld in loads),
        seconds_since_last_batch=min(ld.seconds_since_last_batch for ld in loads),
        batches_completed=sum(ld.batches_completed for ld in loads))
    return {**info_body(first_info), "routing": ctx.settings.routing, "load": load_body(total),
            "pools": [pool_body(p) for ld in loads for p in ld.pools], "replicas": replicas}


async def flush_cache(ctx: GatewayContext):
    """Flushes every replica's pool."""
    answers = await _each(ctx, lambda r: r.client.flush_cache())
    replicas, failed = [], []
    for r, answer in zip(ctx.replicas.replicas, answers):
        if isinstance(answer, ApiError):
            replicas.append({**_where(r), "error": answer.message})
            failed.append(f"{r.name}: {answer.message}")
        elif isinstance(answer, Exception):
            raise answer
        else:
            replicas.append({**_where(r), "freed_tokens": answer.freed_tokens})
    freed = sum(e.get("freed_tokens", 0) for e in replicas)
    return _answer(ctx, not failed, f"the cache of {len(failed)} replica(s) was not flushed: {'; '.join(failed)}",
                   replicas, {"freed_tokens": freed})


async def metrics_loads(ctx: GatewayContext) -> list[tuple[str, scheduler_pb2.GetLoadResponse | None]]:
    """Each replica's GetLoad with request metrics (None where it failed), for GatewayMetrics.render_replicas."""
    answers = await _each(ctx, lambda r: r.client.get_load(request_metrics=True))
    out = []
    for r, answer in zip(ctx.replicas.replicas, answers):
        if isinstance(answer, Exception) and not isinstance(answer, ApiError):
            raise answer
        out.append((r.name, None if isinstance(answer, ApiError) else answer))
    return out
