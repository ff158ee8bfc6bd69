"""ASGI middleware: the request body size limit and the optional Bearer API key."""

from __future__ import annotations

import hmac
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import ApiError
from common import hop_trace

# Paths that never need the API key: probes and metrics scraping.
OPEN_PATHS = frozenset({"/health", "/health_generate", "/ready", "/metrics"})


HTTP_IN = "codeserve.http_in_ns"  # scope key: when the body was read (hop tracing, common/hop_trace.py)


class LimitsAndAuth:
    """Rejects requests whose body exceeds ``max_body_bytes`` (413, checked on Content-Length and
    while reading) and, when ``api_key`` is set, requests without ``Authorization: Bearer <key>``
    (401; compared with hmac.compare_digest). Both answer with the OpenAI error body."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, api_key: str | None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.api_key = api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self.api_key is not None and scope.get("path") not in OPEN_PATHS:
            auth = headers.get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.api_key):
                await ApiError(401, "missing or invalid API key (send Authorization: Bearer <key>)",
                               "authentication_error").response()(scope, receive, send)
                return
        length = headers.get(b"content-length")
        too_large = ApiError(413, f"request body is larger than the limit of {self.max_body_bytes} bytes",
                             "invalid_request_error")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await too_large.response()(scope, receive, send)
            return
        # Read the whole body here (up to the limit), then replay it to the app; later receive()
        # calls go to the server, so the app still sees http.disconnect.
        chunks: list[bytes] = []
        received = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.max_body_bytes:
                await too_large.response()(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        replayed = False
        if hop_trace.enabled():  # the request's id is known at its route: marked there (gateway/fanout.py)
            scope[HTTP_IN] = time.monotonic_ns()

        async def replay_receive() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay_receive, send)


_JSON_TYPES = (b"application/json",)


class JsonBodies:
    """Every POST body of this API is JSON: a POST sent with another Content-Type (curl -d sends
    application/x-www-form-urlencoded) or none is read as JSON, so ``curl -d '{...}'`` works and a
    body that is not JSON gets "request body is not valid JSON". Other methods pass unchanged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            headers = [(k, v) for k, v in scope.get("headers") or [] if k != b"content-type"]
            content_type = dict(scope.get("headers") or []).get(b"content-type", b"")
            media = content_type.split(b";")[0].strip().lower()
            if media not in _JSON_TYPES and not media.endswith(b"+json"):
                scope = {**scope, "headers": headers + [(b"content-type", b"application/json")]}
        await self.app(scope, receive, send)
