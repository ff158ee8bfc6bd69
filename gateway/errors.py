"""API errors: the OpenAI error body, and the mapping from scheduler gRPC status codes to HTTP.

Body: ``{"error": {"message": str, "type": str, "param": str | null, "code": int | str | null}}``.
Mapping: INVALID_ARGUMENT / OUT_OF_RANGE -> 400; NOT_FOUND -> 404; ALREADY_EXISTS (request id in use) -> 409; RESOURCE_EXHAUSTED -> 429 with
Retry-After; UNAVAILABLE / DEADLINE_EXCEEDED / FAILED_PRECONDITION / ABORTED -> 503 with Retry-After;
anything else -> 500 (a server fault, never the client's input). An UNAVAILABLE that gRPC's transport produced
(connection refused, connection lost mid-call) names the scheduler and what happened, gRPC's text at the end.
"""

from __future__ import annotations

import grpc
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


class ApiError(Exception):
    """An error returned to the HTTP client.

    status: HTTP status code. type: OpenAI error type (``invalid_request_error``, ``authentication_error``,
    ``rate_limit_error``, ``service_unavailable``, ``internal_error``, ``not_found_error``).
    param: the request field at fault, when there is one. retry_after_s: sets the Retry-After header.
    counted_upstream (set after construction): the scheduler's request metrics count this outcome already.
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.retry_after_s = retry_after_s
        self.counted_upstream = False  # True: the scheduler counted this outcome of a Generate call

    def body(self) -> dict:
        """The OpenAI error body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}

    def response(self) -> JSONResponse:
        """A JSONResponse with the body, status and Retry-After header (when set)."""
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def invalid(message: str, param: str | None = None) -> ApiError:
    """A 400 invalid_request_error."""
    return ApiError(400, message, "invalid_request_error", param)


_GRPC_TO_HTTP: dict[grpc.StatusCode, tuple[int, str, bool]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error", False),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error", False),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error", False),
    grpc.StatusCode.ALREADY_EXISTS: (409, "invalid_request_error", False),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error", True),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable", True),
    grpc.StatusCode.DEADLINE_EXCEEDED: (503, "service_unavailable", True),
    grpc.StatusCode.FAILED_PRECONDITION: (503, "service_unavailable", True),
    grpc.StatusCode.ABORTED: (503, "service_unavailable", True),
}


# gRPC core's own texts for a broken or missing connection (the client library writes them, not the scheduler;
# the scheduler's own UNAVAILABLE messages start with its words, e.g. "worker w0 has not answered ...").
_CONNECT_FAILED = ("failed to connect to all addresses", "DNS resolution failed", "Name resolution failure")
_CONNECTION_LOST = ("Stream removed", "Socket closed", "Connection reset", "Broken pipe", "GOAWAY received",
                    "Transport closed", "Connection closed", "Endpoint closing", "keepalive watchdog timeout",
                    "Cancelling all calls")


def transport_failure(details: str, target: str) -> str | None:
    """The message for an UNAVAILABLE that gRPC's transport produced (no scheduler answered), in our terms
    with gRPC's text at the end; None when ``details`` is the scheduler's own message (passed through as is).
    ``target``: the scheduler's "host:port"."""
    if details.startswith(_CONNECT_FAILED):
        why = "connection refused" if "Connection refused" in details else "cannot connect"
        return f"the scheduler at {target} is unreachable ({why}); retry later [gRPC: {details}]"
    lost = next((phrase for phrase in _CONNECTION_LOST if details.startswith(phrase)), None)
    if lost is not None:
        return (f"the scheduler at {target} went away while this request ran ({lost}); the request was not "
                f"completed: retry [gRPC: {details}]")
    return None


def from_grpc(code: grpc.StatusCode, details: str | None, retry_after_s: int, target: str | None = None) -> ApiError:
    """Maps a scheduler gRPC status to an ApiError; the scheduler's details become the message. With
    ``target`` (the scheduler's "host:port"), an UNAVAILABLE raised by gRPC's transport (connection refused,
    connection lost mid-call) is named as such (see transport_failure)."""
    status, err_type, retry = _GRPC_TO_HTTP.get(code, (500, "internal_error", False))
    message = details or f"scheduler returned {code.name}"
    if code == grpc.StatusCode.UNAVAILABLE and target is not None and details:
        message = transport_failure(details, target) or message
    if status >= 500 and status != 503:
        message = f"scheduler error {code.name}: {message}"
    return ApiError(status, message, err_type, None, retry_after_s if retry else None)


def counted(request: Request, err: ApiError) -> JSONResponse:
    """``err``'s response, counted in the app's ``codeserve:request_errors`` metric unless the scheduler counted
    it (``counted_upstream``: the outcome of a Generate call, in the scheduler's request metrics)."""
    if not err.counted_upstream:
        request.app.state.ctx.metrics.count_error(err.status, err.type)
    return err.response()


async def api_error_handler(request: Request, exc: ApiError) -> JSONResponse:
    """FastAPI exception handler for ApiError."""
    return counted(request, exc)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _is_type_tag(part: object) -> bool:
    # pydantic puts the union member it tried into "loc" (e.g. "list[int]", "NativeSamplingParams").
    if not isinstance(part, str):
        return False
    return "[" in part or part[:1].isupper() or part in _TYPE_TAGS


NOT_JSON = "request body is not valid JSON: "


def not_utf8(cause: UnicodeDecodeError) -> ApiError:
    """The 400 for a body whose bytes are not UTF-8 text (JSON bodies must be, RFC 8259 §8.1); names the first
    offending byte and its offset."""
    data = cause.object
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as utf8:
        return invalid(f"{NOT_JSON}it is not UTF-8 text (byte 0x{data[utf8.start]:02x} at byte {utf8.start}: "
                       f"{utf8.reason})")
    return invalid(f"{NOT_JSON}it could not be decoded as {cause.encoding} ({cause.reason} at byte {cause.start}); "
                   f"send UTF-8 without a UTF-16/32 byte order")


async def validation_error_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    """Turns pydantic / JSON errors into a 400 with the OpenAI body; ``param`` names the field
    (null for a body that is not valid JSON, including an empty one). Every error is listed, each as
    ``path: message``, separated by ``; ``; ``param`` is the first one's path."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "missing" and tuple(first.get("loc", ())) == ("body",):
        return counted(request, invalid(f"{NOT_JSON}the body is empty (send a JSON object)"))
    if first.get("type") == "json_invalid":
        position = first.get("loc", ())[-1:] or ("?",)
        detail = first.get("ctx", {}).get("error", "JSON decode error")
        return counted(request, invalid(f"{NOT_JSON}{detail} (at character {position[0]})"))
    if first.get("type") in ("lone_surrogate", "misplaced_field"):
        return counted(request, invalid(first["msg"], first["ctx"]["param"]))
    kept = _without_union_misses(errors) or [first]
    clauses: list[str] = []
    for error in kept:
        path = _path(error.get("loc", ()))
        clause = f"{path}: {error.get('msg', 'invalid request')}" if path else error.get("msg", "invalid request")
        if clause not in clauses:  # a union reports the same field once per member it tried
            clauses.append(clause)
    return counted(request, invalid("; ".join(clauses), _path(kept[0].get("loc", ())) or None))


def _without_union_misses(errors: list[dict]) -> list[dict]:
    """``errors`` less the "input is not of this member's type" errors of a union (``sampling_params``: one
    object or a list) when another member of the same union did match the type and has the real errors."""
    def split(error: dict) -> tuple[tuple, object, bool]:
        loc = tuple(error.get("loc", ()))
        k = next((i for i, part in enumerate(loc) if _is_type_tag(part)), None)
        if k is None:
            return loc, None, False
        return loc[:k], loc[k], len(loc) == k + 1 and str(error.get("type", "")).endswith("_type")
    parts = [split(error) for error in errors]
    matched = {(prefix, tag) for prefix, tag, miss in parts if tag is not None and not miss}
    return [error for error, (prefix, tag, miss) in zip(errors, parts)
            if not (miss and any(p == prefix and t != tag for p, t in matched))]


def _path(loc) -> str:
    """A pydantic ``loc`` as a field path: ``sampling_params[1].min_p``, ``messages[0].content``."""
    path = ""
    for part in loc:
        if part == "body" or _is_type_tag(part):
            continue
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path
