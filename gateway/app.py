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
from gateway.readiness import SchedulerWatch
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


def create_app(scheduler_client: SchedulerClient, tokenizer: GatewayTokenizer, settings: GatewaySettings) -> FastAPI:
    """Builds the app. The scheduler client's channel is closed at shutdown."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        watch = None
        if settings.probe_interval_s > 0:
            watch = asyncio.create_task(SchedulerWatch(scheduler_client, settings.probe_interval_s,
                                                       settings.probe_timeout_s, settings.retry_after_s).run())
        yield
        if watch is not None:
            watch.cancel()
            with suppress(asyncio.CancelledError):
                await watch
        await scheduler_client.close()

    app = FastAPI(title="codeserve gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.ctx = GatewayContext(scheduler_client, tokenizer, settings, GatewayMetrics(settings.model_name))
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
