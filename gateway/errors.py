"""API errors: the OpenAI error body, and the mapping from scheduler gRPC status codes to HTTP.

Body: ``{"error": {"message": str, "type": str, "param": str | null, "code": int | str | null}}``.
Mapping: INVALID_ARGUMENT / OUT_OF_RANGE -> 400; NOT_FOUND -> 404; ALREADY_EXISTS (request id in use) -> 409; RESOURCE_EXHAUSTED -> 429 with
Retry-After; UNAVAILABLE / DEADLINE_EXCEEDED / FAILED_PRECONDITION / ABORTED -> 503 with Retry-After;
anything else -> 500 (a server fault, never the client's input).
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


def from_grpc(code: grpc.StatusCode, details: str | None, retry_after_s: int) -> ApiError:
    """Maps a scheduler gRPC status to an ApiError; the scheduler's details become the message."""
    status, err_type, retry = _GRPC_TO_HTTP.get(code, (500, "internal_error", False))
    message = details or f"scheduler returned {code.name}"
    if status >= 500 and status != 503:
        message = f"scheduler error {code.name}: {message}"
    return ApiError(status, message, err_type, None, retry_after_s if retry else None)


def counted(request: Request, err: ApiError) -> JSONResponse:
    """``err``'s response, counted in the app's ``codeserve:request_errors`` metric."""
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


async def validation_error_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    """Turns pydantic / JSON errors into a 400 with the OpenAI body; ``param`` names the field
    (null for a body that is not valid JSON)."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        position = first.get("loc", ())[-1:] or ("?",)
        detail = first.get("ctx", {}).get("error", "JSON decode error")
        return counted(request, invalid(f"request body is not valid JSON: {detail} (at character {position[0]})"))
    if first.get("type") in ("lone_surrogate", "misplaced_field"):
        return counted(request, invalid(first["msg"], first["ctx"]["param"]))
    loc = [str(part) for part in first.get("loc", ()) if part != "body" and not _is_type_tag(part)]
    param = ".".join(loc) or None
    message = first.get("msg", "invalid request")
    if param:
        message = f"{param}: {message}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more errors)"
    return counted(request, invalid(message, param))
