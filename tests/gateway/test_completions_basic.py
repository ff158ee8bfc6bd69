"""/v1/completions against the fake scheduler: non-streamed and streamed."""

from __future__ import annotations

import json

import httpx

from tests.gateway.conftest import MODEL_NAME


def sse_events(response: httpx.Response) -> list:
    events = []
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_completion_text_prompt(gateway, fake, tokenizer):
    r = httpx.post(f"{gateway.url}/v1/completions",
                   json={"model": MODEL_NAME, "prompt": "def add(a, b):\n", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    script = tokenizer.encode(fake.continuation)
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == tokenizer.decode(script[:4])
    assert body["choices"][0]["finish_reason"] == "length"
    prompt_ids = tokenizer.encode("def add(a, b):\n")
    assert body["usage"] == {"prompt_tokens": len(prompt_ids), "completion_tokens": 4,
                             "total_tokens": len(prompt_ids) + 4, "prompt_tokens_details": {"cached_tokens": 0}}
    sent = fake.requests[-1]
    assert list(sent.input_ids.ids) == prompt_ids
    assert sent.max_new_tokens == 4
    assert sent.sampling.temperature == 0


def test_completion_stream_equals_nonstream(gateway, fake):
    payload = {"model": MODEL_NAME, "prompt": "def add(a, b):\n", "max_tokens": 40, "temperature": 0}
    whole = httpx.post(f"{gateway.url}/v1/completions", json=payload).json()
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json={**payload, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "text_completion" and c["usage"] is None for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == whole["choices"][0]["finish_reason"] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
