"""/v1/chat/completions and the chat template."""

from __future__ import annotations

import httpx
import pytest

from gateway.chat_template import DEFAULT_STOPS, render
from gateway.schemas import ChatMessage
from tests.gateway.conftest import MODEL_NAME
from tests.gateway.helpers import stream
from tests.gateway.test_errors import assert_error

MESSAGES = [
    {"role": "system", "content": "You write Python."},
    {"role": "user", "content": "Add two numbers."},
    {"role": "assistant", "content": "def add(a, b): return a + b"},
    {"role": "user", "content": [{"type": "text", "text": "Now "}, {"type": "text", "text": "subtract."}]},
]
RENDERED = ("You write Python.\n\n"
            "### Instruction:\nAdd two numbers.\n\n"
            "### Response:\ndef add(a, b): return a + b\n\n"
            "### Instruction:\nNow subtract.\n\n"
            "### Response:\n")


def test_template_renders_as_documented():
    messages = [ChatMessage.model_validate(m) for m in MESSAGES]
    assert render(messages) == RENDERED
    assert render(messages, add_generation_prompt=False) == RENDERED[: -len("### Response:\n")]


def test_chat_completion(gateway, fake, tokenizer):
    r = httpx.post(f"{gateway.url}/v1/chat/completions",
                   json={"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 4, "stop": "END"})
    assert r.status_code == 200, r.text
    body = r.json()
    sent = fake.requests[-1]
    assert list(sent.input_ids.ids) == tokenizer.encode(RENDERED)
    assert list(sent.stop) == ["END", *DEFAULT_STOPS]
    assert sent.max_new_tokens == 4
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant",
                                 "content": tokenizer.decode(tokenizer.encode(fake.continuation)[:4])}
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None
    assert body["usage"]["prompt_tokens"] == len(tokenizer.encode(RENDERED))
    assert body["usage"]["completion_tokens"] == 4


def test_chat_default_max_tokens_fills_the_context(gateway, fake, tokenizer):
    from tests.gateway.conftest import N_POSITIONS

    httpx.post(f"{gateway.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert fake.requests[-1].max_new_tokens == N_POSITIONS - len(tokenizer.encode(
        "### Instruction:\nhi\n\n### Response:\n"))


def test_chat_max_completion_tokens_wins(gateway, fake):
    httpx.post(f"{gateway.url}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9, "max_completion_tokens": 3})
    assert fake.requests[-1].max_new_tokens == 3


def test_chat_logprobs(gateway, fake, tokenizer):
    body = httpx.post(f"{gateway.url}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logprobs": True, "top_logprobs": 2}).json()
    content = body["choices"][0]["logprobs"]["content"]
    ids = tokenizer.encode(fake.continuation)[:2]
    assert [c["token"] for c in content] == [tokenizer.token_text(t) for t in ids]
    assert [c["logprob"] for c in content] == pytest.approx([-0.1, -0.2], abs=1e-6)
    assert content[0]["bytes"] == list(tokenizer.token_text(ids[0]).encode())
    assert [len(c["top_logprobs"]) for c in content] == [2, 2]


def test_chat_logprob_bytes_rebuild_a_multibyte_character(gateway, fake, tokenizer):
    """A character split over several tokens: each token's ``bytes`` are its own bytes (its ``token`` text is
    U+FFFD), so the bytes joined are the content's UTF-8. Was: U+FFFD's bytes for each piece."""
    fake.continuation = "caf\u00e9 \U0001f600\n"
    body = httpx.post(f"{gateway.url}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "logprobs": True}).json()
    choice = body["choices"][0]
    content = choice["logprobs"]["content"]
    assert any(c["token"] == "\ufffd" for c in content)  # the emoji is split
    assert content[-1]["token"] == "<|endoftext|>"  # EOS: in the logprobs, its text skipped from the content
    assert bytes(b for c in content[:-1] for b in c["bytes"]) == choice["message"]["content"].encode()


def test_chat_stream(gateway, fake, tokenizer):
    status, events = stream(gateway, "/v1/chat/completions", {
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True,
        "stream_options": {"include_usage": True}})
    assert status == 200 and events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1])
    assert text == tokenizer.decode(tokenizer.encode(fake.continuation)[:5])
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


def test_openai_client_chat(gateway, fake, tokenizer):
    import openai

    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused")
    out = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=3, n=2, seed=5)
    assert len(out.choices) == 2
    expected = tokenizer.decode(tokenizer.encode(fake.continuation)[:3])
    assert [c.message.content for c in out.choices] == [expected, expected]
    assert sorted(r.sampling.seed for r in fake.requests[-2:]) == [5, 6]
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=3, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected


@pytest.mark.parametrize("payload,param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, None),
])
def test_chat_bad_input(gateway, fake, payload, param):
    assert_error(httpx.post(f"{gateway.url}/v1/chat/completions", json=payload), 400, param=param)
    assert fake.requests == []
