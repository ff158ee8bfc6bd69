"""Optional Bearer API key; limits on body size, n, prompts, stop strings and logprobs."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.conftest import MODEL_NAME
from tests.gateway.test_errors import assert_error


def test_api_key_required_when_set(start_gateway, fake):
    gw = start_gateway(api_key="s3cret")
    payload = {"model": MODEL_NAME, "prompt": "x", "max_tokens": 1}
    assert_error(httpx.post(f"{gw.url}/v1/completions", json=payload), 401, "API key")
    wrong = httpx.post(f"{gw.url}/v1/completions", json=payload, headers={"Authorization": "Bearer nope"})
    assert wrong.json()["error"]["type"] == "authentication_error" and wrong.status_code == 401
    assert httpx.post(f"{gw.url}/v1/completions", json=payload,
                      headers={"Authorization": "Basic s3cret"}).status_code == 401
    ok = httpx.post(f"{gw.url}/v1/completions", json=payload, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    assert len(fake.requests) == 1  # only the authorised request reached the scheduler
    for path in ("/v1/models", "/server_info"):
        assert httpx.get(f"{gw.url}{path}").status_code == 401
    assert httpx.post(f"{gw.url}/flush_cache").status_code == 401
    for path in ("/health", "/metrics"):
        assert httpx.get(f"{gw.url}{path}").status_code == 200


def test_openai_client_with_api_key(start_gateway, fake):
    import openai

    gw = start_gateway(api_key="s3cret")
    good = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="s3cret")
    assert good.completions.create(model=MODEL_NAME, prompt="x", max_tokens=1).usage.completion_tokens == 1
    bad = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="other", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=MODEL_NAME, prompt="x", max_tokens=1)


def test_body_size_limit(start_gateway, fake):
    gw = start_gateway(max_body_bytes=1000)
    r = httpx.post(f"{gw.url}/v1/completions", json={"model": MODEL_NAME, "prompt": "x" * 2000})
    assert_error(r, 413, "1000 bytes")

    def chunks():  # no Content-Length: the limit is enforced while reading
        yield b'{"prompt": "'
        for _ in range(20):
            yield b"y" * 100
        yield b'"}'

    r = httpx.post(f"{gw.url}/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert_error(r, 413)
    assert fake.requests == []
    assert httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200


@pytest.mark.parametrize("payload,param,fragment", [
    ({"prompt": "x", "n": 17}, "n", "limit is 16"),
    ({"prompt": ["x"] * 9, "n": 2}, "n", "limit is 16"),
    ({"prompt": ["x"] * 17}, "prompt", "limit is 16"),
    ({"prompt": "x", "stop": [str(i) for i in range(17)]}, "stop", "limit is 16"),
    ({"prompt": "x", "stop": "z" * 1025}, "stop", "limit is 1024"),
    ({"prompt": "x", "logprobs": 21}, "logprobs", "limit is 20"),
])
def test_limits(start_gateway, fake, payload, param, fragment):
    gw = start_gateway(max_n=16, max_prompts=16)
    r = httpx.post(f"{gw.url}/v1/completions", json={"model": MODEL_NAME, **payload})
    assert_error(r, 400, fragment, param=param)
    assert fake.requests == []
