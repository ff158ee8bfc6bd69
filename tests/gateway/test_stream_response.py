"""fanout.stream_response, the one server-sent-events answer of the three streaming endpoints: one event per
payload, an error event for an exception (counted in codeserve:request_errors unless the scheduler counted it),
[DONE] last, and every stream cancelled however the response ends."""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.errors import ApiError
from gateway.fanout import stream_response
from gateway.metrics import GatewayMetrics
from tests.gateway.test_admin import _samples


class RecordingStream:
    """Stands in for a GenerationStream: counts cancel() calls."""

    def __init__(self) -> None:
        self.cancelled = 0

    def cancel(self) -> None:
        self.cancelled += 1


def answer(payloads, metrics: GatewayMetrics | None = None) -> tuple[list, list[RecordingStream], str]:
    """GET through a real ASGI app whose endpoint returns stream_response over two streams; returns the
    parsed events, the streams and the content type."""
    streams = [RecordingStream(), RecordingStream()]
    metrics = metrics if metrics is not None else GatewayMetrics("m")
    app = Starlette(routes=[Route("/", lambda request: stream_response(metrics, streams, payloads()))])
    with TestClient(app) as client:
        reply = client.get("/")
    assert reply.status_code == 200
    events = [line[len("data: "):] for line in reply.text.split("\n\n") if line]
    return [e if e == "[DONE]" else json.loads(e) for e in events], streams, reply.headers["content-type"]


def errors(metrics: GatewayMetrics) -> dict[str, float]:
    """The codeserve:request_errors_total samples of ``metrics`` ({"...|status=..|type=..": value})."""
    return {k: v for k, v in _samples(metrics.render(None).decode()).items()
            if k.startswith("codeserve:request_errors_total")}


def test_each_payload_is_one_event_then_done_and_the_streams_are_cancelled() -> None:
    async def payloads():
        yield {"a": 1}
        yield {"b": "é"}

    events, streams, content_type = answer(payloads)
    assert events == [{"a": 1}, {"b": "é"}, "[DONE]"]
    assert [s.cancelled for s in streams] == [1, 1]
    assert content_type.startswith("text/event-stream")


def test_an_api_error_after_the_first_event_is_its_error_body_then_done() -> None:
    async def payloads():
        yield {"a": 1}
        raise ApiError(503, "worker lost", "service_unavailable")

    metrics = GatewayMetrics("m")
    events, streams, _ = answer(payloads, metrics)
    assert events == [{"a": 1}, {"error": {"message": "worker lost", "type": "service_unavailable", "param": None,
                                           "code": 503}}, "[DONE]"]
    assert [s.cancelled for s in streams] == [1, 1]
    # no Generate call counted it (e.g. the scheduler died mid-stream): the gateway does (was: counted nowhere)
    assert errors(metrics) == {"codeserve:request_errors_total|status=503|type=service_unavailable": 1.0}


def test_an_error_the_scheduler_counted_is_not_counted_again() -> None:
    async def payloads():
        yield {"a": 1}
        error = ApiError(503, "request aborted by the scheduler", "service_unavailable")
        error.counted_upstream = True
        raise error

    metrics = GatewayMetrics("m")
    events, _, _ = answer(payloads, metrics)
    assert events[1]["error"]["code"] == 503
    assert errors(metrics) == {}


def test_any_other_exception_is_a_500_internal_error_event() -> None:
    async def payloads():
        raise RuntimeError("boom")
        yield {}  # an async generator

    metrics = GatewayMetrics("m")
    events, streams, _ = answer(payloads, metrics)
    assert events[0]["error"]["code"] == 500 and events[0]["error"]["message"] == "internal error: boom"
    assert events[1:] == ["[DONE]"]
    assert [s.cancelled for s in streams] == [1, 1]
    assert errors(metrics) == {"codeserve:request_errors_total|status=500|type=internal_error": 1.0}
