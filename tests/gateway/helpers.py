"""Small HTTP helpers for the gateway tests."""

from __future__ import annotations

import json

import httpx

from tests.gateway.conftest import MODEL_NAME


def sse_events(response: httpx.Response) -> list:
    """Parses a text/event-stream body: JSON objects, and the final "[DONE]" as a string."""
    events = []
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def complete(gateway, **payload) -> httpx.Response:
    """POST /v1/completions with the test model's name."""
    return httpx.post(f"{gateway.url}/v1/completions", json={"model": MODEL_NAME, **payload}, timeout=30)


def stream(gateway, path: str, payload: dict) -> tuple[int, list]:
    """POSTs a streaming request; returns (status, events)."""
    with httpx.stream("POST", f"{gateway.url}{path}", json=payload, timeout=30) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, [r.json()]
        return r.status_code, sse_events(r)


def whole_and_streamed(gateway, payload: dict) -> tuple[dict, list[dict]]:
    """/v1/completions for ``payload`` twice: whole, then streamed. Returns the whole answer's body and the
    streamed chunks before [DONE]; asserts both answered 200 and the stream ended with [DONE]."""
    whole = complete(gateway, **payload)
    assert whole.status_code == 200, whole.text
    status, events = stream(gateway, "/v1/completions", {"model": MODEL_NAME, **payload, "stream": True})
    assert status == 200, events
    assert events[-1] == "[DONE]"
    return whole.json(), events[:-1]
