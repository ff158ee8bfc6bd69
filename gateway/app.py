"""The FastAPI application: routes, error handlers and middleware."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager, suppress

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway import admin_api, chat_api, native_api, openai_api
from gateway.context import GatewayContext
from gateway.disconnect import ClientDisconnected
from gateway.errors import ApiError, api_error_handler, counted, not_utf8, validation_error_handler
from gateway.metrics import GatewayMetrics
from gateway.middleware import JsonBodies, LimitsAndAuth
from gateway.cache_probe import CacheProbe
from gateway.dispatch import Dispatcher
from gateway.pending import PendingTable
from gateway.replica_spec import ReplicaSpec
from gateway.replicas import Replica, ReplicaSet
from gateway.router import Policy, Router, Weights
from gateway.routing_metrics import RoutingMetrics
from gateway.scheduler_client import SchedulerClient
from gateway.settings import GatewaySettings
from gateway.tokenizer import GatewayTokenizer

log = structlog.get_logger()


async def _http_exception_handler(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if isinstance(exc.__cause__, UnicodeDecodeError):  # FastAPI's "error parsing the body" for non-UTF-8 bytes
        return counted(request, not_utf8(exc.__cause__))
    err_type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return counted(request, ApiError(exc.status_code, str(exc.detail), err_type))


async def _disconnected_handler(request: Request, _exc: ClientDisconnected) -> Response:
    # Nobody reads this; 499 is the conventional "client closed request" status for logs. Not counted here: its
    # Generate calls were cancelled, and the scheduler counts each as finished_reason "abort" (docs/api.md).
    return Response(status_code=499)


async def _unexpected_handler(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled_error", path=request.url.path, error=repr(exc), exc_info=exc)
    return counted(request, ApiError(500, f"internal error: {exc}", "internal_error"))


def create_app(scheduler: SchedulerClient | ReplicaSet, tokenizer: GatewayTokenizer,
               settings: GatewaySettings) -> FastAPI:
    """Builds the app over one scheduler client (one replica, as always) or a replica set. The channels are closed
    at shutdown."""
    replicas = scheduler if isinstance(scheduler, ReplicaSet) else ReplicaSet(
        [Replica(0, ReplicaSpec(scheduler.target), scheduler)], settings.probe_interval_s, settings.probe_timeout_s,
        settings.retry_after_s, settings.load_interval_s)
    metrics = GatewayMetrics(settings.model_name)
    probe = CacheProbe(settings.cache_probe_timeout_s)
    if replicas.single:
        dispatcher = Dispatcher(replicas, None, None, None)
    else:
        pending = PendingTable(settings.pending_ttl_s)
        router = Router(replicas, pending, probe, Policy(settings.routing),
                        Weights(settings.route_queued_weight, settings.route_requests_weight))
        dispatcher = Dispatcher(replicas, router, pending, RoutingMetrics(metrics.registry, settings.model_name))

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        tasks = replicas.tasks()
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with suppress(asyncio.CancelledError):
                await task
        await replicas.close()
        await probe.close()

    app = FastAPI(title="codeserve gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.ctx = GatewayContext(replicas, dispatcher, tokenizer, settings, metrics)
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, _http_exception_handler)
    app.add_exception_handler(ClientDisconnected, _disconnected_handler)
    app.add_exception_handler(Exception, _unexpected_handler)
    app.include_router(openai_api.router)
    app.include_router(chat_api.router)
    app.include_router(native_api.router)
    app.include_router(admin_api.router)
    app.add_middleware(JsonBodies)
    app.add_middleware(LimitsAndAuth, max_body_bytes=settings.max_body_bytes, api_key=settings.api_key)
    return app
