"""New-user input bugs: lone surrogates (B1), huge text prompts (B3), loose types and JSON bodies
(L1, L2), /tokenize with no messages (L4). Each is a 400 naming the field, and nothing reaches the
scheduler."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from gateway.app import create_app
from gateway.scheduler_client import SchedulerClient
from gateway.tokenizer import GatewayTokenizer
from scheduler_svc import validate
from tests.gateway.conftest import MODEL_NAME, N_POSITIONS, Gateway, make_settings
from tests.gateway.helpers import complete
from tests.gateway.test_errors import assert_error

LONE = "\ud800"


def post_raw(gateway, path: str, body: str, content_type: str | None = "application/json") -> httpx.Response:
    """POSTs ``body`` as is (json.dumps escapes a lone surrogate as \\ud800, like a client would)."""
    headers = {"Content-Type": content_type} if content_type else {}
    return httpx.post(f"{gateway.url}{path}", content=body.encode(), headers=headers, timeout=30)


@pytest.mark.parametrize("path,payload,param", [
    ("/v1/completions", {"model": MODEL_NAME, "prompt": LONE, "max_tokens": 2}, "prompt"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": ["ok", "a" + LONE]}, "prompt[1]"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "ok", "stop": [LONE]}, "stop[0]"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "ok", "stop": "\udc00x"}, "stop"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": LONE}]},
     "messages[0].content"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi " + LONE}]}]}, "messages[0].content[0].text"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}],
                              "stop": [LONE]}, "stop[0]"),
    ("/generate", {"text": LONE}, "text"),
    ("/generate", {"text": "ok", "sampling_params": {"stop": [LONE]}}, "sampling_params.stop[0]"),
    ("/tokenize", {"prompt": LONE}, "prompt"),
])
def test_b1_lone_surrogate_is_400_naming_the_field(gateway, fake, path, payload, param):
    r = post_raw(gateway, path, json.dumps(payload))
    escaped = "\\ud800" if LONE in json.dumps(payload, ensure_ascii=False) else "\\udc00"
    err = assert_error(r, 400, f"{param} contains a lone UTF-16 surrogate ({escaped})", "not valid Unicode text",
                       param=param)
    assert err["type"] == "invalid_request_error"
    assert fake.requests == []
    ok = complete(gateway, prompt="def add(a, b):", max_tokens=2)
    assert ok.status_code == 200


def test_b1_a_valid_surrogate_pair_is_text(gateway, fake):
    r = post_raw(gateway, "/tokenize", json.dumps({"prompt": "\U0001f600"}))  # sent as \ud83d\ude00
    assert r.status_code == 200, r.text
    assert r.json()["count"] >= 1


class _SpyTokenizer(GatewayTokenizer):
    """Records the texts given to encode_async."""

    def __init__(self, inner: GatewayTokenizer) -> None:
        super().__init__(inner._tok)
        self.encoded: list[str] = []

    async def encode_async(self, text: str) -> list[int]:
        self.encoded.append(text)
        return await super().encode_async(text)


@pytest.fixture
def spy_gateway(fake_server, tokenizer):
    spy = _SpyTokenizer(tokenizer)
    client = SchedulerClient(f"127.0.0.1:{fake_server[1].port}", retry_after_s=1, unary_timeout_s=2.0)
    gw = Gateway(create_app(client, spy, make_settings()))
    yield gw, spy
    gw.stop()


def test_b3_text_that_cannot_fit_is_rejected_without_tokenizing(spy_gateway, fake, tokenizer):
    gw, spy = spy_gateway
    longest = tokenizer.max_token_chars
    assert longest is not None and longest > 1
    above = "a" * ((N_POSITIONS - 1) * longest + 1)  # ceil(C / L) == N_POSITIONS: cannot fit
    for path, payload, param in [
        ("/v1/completions", {"prompt": above}, "prompt"),
        ("/v1/completions", {"prompt": ["ok", above]}, "prompt[1]"),
        ("/generate", {"text": above}, "text"),
    ]:
        r = httpx.post(f"{gw.url}{path}", json=payload, timeout=30)
        assert_error(r, 400, f"at least {N_POSITIONS} tokens", f"context limit (n_positions) is {N_POSITIONS}",
                     param=param)
    assert above not in spy.encoded
    assert fake.requests == []
    # one character less is not rejected early: it is tokenized and its exact count decides
    at_bound = above[:-1]
    r = complete(gw, prompt=at_bound)
    assert at_bound in spy.encoded
    n = len(tokenizer.encode(at_bound))
    assert r.status_code == 400 and f"has {n} tokens" in r.json()["error"]["message"]


@pytest.mark.parametrize("text", [
    "def add(a, b):\n    return a + b\n" * 40,
    "<|endoftext|><fim_prefix>" * 30,
    "caf\u00e9 \u4e2d\u6587 \U0001f600 " * 40,
    "    " * 300,
])
def test_b3_the_early_bound_never_exceeds_the_real_count(tokenizer, text):
    assert tokenizer.min_tokens(text) <= len(tokenizer.encode(text))


def test_b3_longest_token_length_counts_special_tokens(tokenizer):
    assert tokenizer.max_token_chars >= len("<|endoftext|>")


class _BlockingTok:
    """A tokenizers.Tokenizer whose encoding of texts starting with "slow" waits for ``release``."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.entered = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _wait(self, text: str) -> None:
        if text.startswith("slow"):
            self.entered.set()
            assert self.release.wait(30)

    def encode(self, text, *args, **kwargs):
        self._wait(text)
        return self._inner.encode(text, *args, **kwargs)

    def encode_batch(self, texts, *args, **kwargs):
        self._wait(texts[0])
        return self._inner.encode_batch(texts, *args, **kwargs)


def test_b3_a_slow_tokenization_does_not_block_other_requests(fake_server, fake, tokenizer):
    blocking = _BlockingTok(tokenizer._tok)
    client = SchedulerClient(f"127.0.0.1:{fake_server[1].port}", retry_after_s=1, unary_timeout_s=2.0)
    gw = Gateway(create_app(client, GatewayTokenizer(blocking), make_settings()))
    slow_result: list[httpx.Response] = []
    slow = threading.Thread(target=lambda: slow_result.append(complete(gw, prompt="slow def add(a, b):", max_tokens=2)))
    try:
        slow.start()
        assert blocking.entered.wait(10)
        small = complete(gw, prompt="def add(a, b):", max_tokens=2)  # ReadTimeout if the event loop is blocked
        assert small.status_code == 200 and small.json()["usage"]["completion_tokens"] == 2
        assert not blocking.release.is_set() and slow.is_alive()  # the small one finished while the slow one waited
    finally:
        blocking.release.set()
        slow.join(30)
        gw.stop()
    assert slow_result and slow_result[0].status_code == 200


@pytest.mark.parametrize("path,payload,param", [
    ("/v1/completions", {"prompt": "a", "max_tokens": True}, "max_tokens"),
    ("/v1/completions", {"prompt": "a", "stream": "yes"}, "stream"),
    ("/v1/completions", {"prompt": "a", "echo": "yes"}, "echo"),
    ("/v1/completions", {"prompt": "a", "n": 1.0}, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "stream": 1}, "stream"),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": True}}, "sampling_params.max_new_tokens"),
    ("/generate", {"input_ids": [1.0, 2]}, None),
    ("/detokenize", {"tokens": [1.0]}, "tokens[0]"),
    # numbers sent as strings or booleans (was: taken, "0" as 0.0; OpenAI refuses them)
    ("/v1/completions", {"prompt": "a", "temperature": "0"}, "temperature"),
    ("/v1/completions", {"prompt": "a", "top_p": "0.5"}, "top_p"),
    ("/v1/completions", {"prompt": "a", "min_p": "0.1"}, "min_p"),
    ("/v1/completions", {"prompt": "a", "presence_penalty": "1"}, "presence_penalty"),
    ("/v1/completions", {"prompt": "a", "temperature": True}, "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "top_p": "1"}, "top_p"),
    ("/generate", {"text": "a", "sampling_params": {"temperature": "0"}}, "sampling_params.temperature"),
    ("/generate", {"text": "a", "rid": ""}, "rid"),  # was: taken as no id and echoed as meta_info.id ""
    ("/generate", {"text": ["a", "b"], "rid": ["x", ""]}, "rid"),
])
def test_l1_loose_types_are_400(gateway, fake, path, payload, param):
    r = httpx.post(f"{gateway.url}{path}", json=payload, timeout=30)
    assert_error(r, 400, param=param)
    assert fake.requests == []


@pytest.mark.parametrize("field", ["temperature", "top_p", "presence_penalty"])
def test_l2_nan_and_infinity_must_be_finite(gateway, fake, field):
    for literal in ("NaN", "Infinity"):
        r = post_raw(gateway, "/v1/completions", f'{{"prompt": "a", "{field}": {literal}}}')
        assert_error(r, 400, f"{field}:", "finite number", param=field)
    assert fake.requests == []


def test_l2_invalid_json_says_so_without_a_param(gateway, fake):
    r = post_raw(gateway, "/v1/completions", "{bad json")
    err = assert_error(r, 400, param=None)
    assert err["message"].startswith("request body is not valid JSON: "), err["message"]
    assert err["param"] is None


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
def test_l2_json_body_without_json_content_type_is_parsed(gateway, fake, content_type):
    r = post_raw(gateway, "/v1/completions", json.dumps({"prompt": "def add(a, b):", "max_tokens": 2}), content_type)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2
    bad = post_raw(gateway, "/v1/completions", "prompt=hello", content_type)
    assert bad.json()["error"]["message"].startswith("request body is not valid JSON")


def test_l3_gateway_and_scheduler_stop_limits_agree():
    settings = make_settings()
    assert (settings.max_stop_strings, settings.max_stop_chars) == (validate.MAX_STOP_STRINGS, validate.MAX_STOP_CHARS)


def test_l4_tokenize_with_no_messages_is_400(gateway, fake):
    r = httpx.post(f"{gateway.url}/tokenize", json={"messages": []}, timeout=30)
    assert_error(r, 400, "messages", param="messages")


@pytest.mark.parametrize("path,payload,param", [
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "ok", "max_tokens": 2, "top_k": 2**31}, "top_k"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}],
                              "top_k": 2**40}, "top_k"),
    ("/generate", {"text": "ok", "sampling_params": {"max_new_tokens": 2, "top_k": 2**31}}, "sampling_params.top_k"),
])
def test_a_top_k_past_the_wire_s_int32_is_400_naming_the_field(gateway, fake, path, payload, param):
    """top_k travels as an int32 (common.proto): a larger value is refused at the door, not a 500 from the proto."""
    r = post_raw(gateway, path, json.dumps(payload))
    assert_error(r, 400, param=param)
    assert fake.requests == []
    assert complete(gateway, prompt="def add(a, b):", max_tokens=2, top_k=2**31 - 1).status_code == 200
