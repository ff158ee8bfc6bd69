"""Bad input -> 400 with the OpenAI error body (A1, A5), gRPC status mapping, and nothing else changes."""

from __future__ import annotations

import grpc
import httpx
import pytest

from tests.gateway.conftest import MODEL_NAME, N_POSITIONS
from tests.gateway.helpers import complete, stream


def assert_error(r: httpx.Response, status: int, *fragments: str, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    for fragment in fragments:
        assert fragment in err["message"], (fragment, err["message"])
    if param is not None:
        assert err["param"] == param
    return err


@pytest.mark.parametrize("path,payload,param", [
    ("/v1/completions", {"model": MODEL_NAME, "prompt": ""}, "prompt"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": [""]}, "prompt[0]"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": []}, "prompt"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": [[]]}, "prompt[0]"),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": "", "stream": True}, "prompt"),
    ("/generate", {"text": ""}, "text"),
    ("/generate", {"input_ids": []}, "input_ids"),
    ("/generate", {"text": []}, "text"),
    ("/generate", {"input_ids": [[]]}, "input_ids[0]"),
])
def test_a1_empty_input_is_400_and_next_request_succeeds(gateway, fake, path, payload, param):
    r = httpx.post(f"{gateway.url}{path}", json=payload)
    err = assert_error(r, 400, "empty", param=param)
    assert err["type"] == "invalid_request_error"
    assert fake.requests == []  # nothing reached the scheduler
    ok = complete(gateway, prompt="def add(a, b):", max_tokens=2)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_a5_prompt_too_long_names_length_and_limit(gateway, fake, tokenizer):
    ids = [5] * (N_POSITIONS + 10)
    err = assert_error(complete(gateway, prompt=ids, max_tokens=16), 400, str(N_POSITIONS + 10), str(N_POSITIONS),
                       param="prompt")
    assert "n_positions" in err["message"]
    assert_error(httpx.post(f"{gateway.url}/generate", json={"input_ids": ids}), 400, str(N_POSITIONS + 10))
    text = "a b " * 200
    n = len(tokenizer.encode(text))
    assert n >= N_POSITIONS
    assert_error(complete(gateway, prompt=text), 400, str(n), str(N_POSITIONS))
    # exactly n_positions tokens leaves no room either
    assert_error(complete(gateway, prompt=[5] * N_POSITIONS, max_tokens=0), 400, str(N_POSITIONS))
    assert fake.requests == []


def test_a5_generation_capped_at_context_limit(gateway, fake):
    fake.continuation = "a b c d e f g h i j k l m n o p q r s t"
    ids = [5] * (N_POSITIONS - 4)
    r = complete(gateway, prompt=ids, max_tokens=16)
    assert r.status_code == 200, r.text
    assert fake.requests[-1].max_new_tokens == 4
    body = r.json()
    assert body["usage"]["completion_tokens"] == 4
    assert body["choices"][0]["finish_reason"] == "length"
    n = httpx.post(f"{gateway.url}/generate", json={"input_ids": ids,
                                                   "sampling_params": {"max_new_tokens": 100}}).json()
    assert n["meta_info"]["completion_tokens"] == 4
    assert n["meta_info"]["finish_reason"] == {"type": "length", "length": 4}


@pytest.mark.parametrize("payload,param", [
    ({"prompt": [1, 400]}, "prompt"),
    ({"prompt": [1, -1]}, "prompt"),
    ({"prompt": ["a", [1]]}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "logprobs": -1}, "logprobs"),
    ({"prompt": "x", "seed": -5}, "seed"),
    ({"prompt": "x", "stop": [""]}, "stop"),
    ({"prompt": "x", "stop_token_ids": [100000]}, "stop_token_ids"),
    ({"prompt": "x", "presence_penalty": 3}, "presence_penalty"),
    ({"prompt": [1, 2], "suffix": "y"}, "prompt"),
    ({"prompt": "x", "fim_mode": "spm"}, "fim_mode"),
    ({"prompt": "x", "suffix": "y", "fim_mode": "pms"}, "fim_mode"),
    ({"prompt": "x", "suffix": "y", "echo": True, "logprobs": 1}, "echo"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"prompt": "x", "logit_bias": {"5": 100}}, "logit_bias"),
    ({"prompt": "x", "response_format": {"type": "json_object"}}, "response_format"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({}, "prompt"),
])
def test_invalid_fields_are_400_naming_the_field(gateway, fake, payload, param):
    assert_error(complete(gateway, **payload), 400, param=param)
    assert fake.requests == []


def test_malformed_json_is_400(gateway):
    r = httpx.post(f"{gateway.url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert_error(r, 400)


def test_unknown_model_is_404(gateway, fake):
    r = httpx.post(f"{gateway.url}/v1/completions", json={"model": "gpt-9", "prompt": "x"})
    assert_error(r, 404, "gpt-9", param="model")


def test_unknown_path_is_404_with_error_body(gateway):
    assert_error(httpx.get(f"{gateway.url}/v1/nothing"), 404)


@pytest.mark.parametrize("code,status,retry", [
    (grpc.StatusCode.INVALID_ARGUMENT, 400, False),
    (grpc.StatusCode.OUT_OF_RANGE, 400, False),
    (grpc.StatusCode.ALREADY_EXISTS, 409, False),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, 429, True),
    (grpc.StatusCode.UNAVAILABLE, 503, True),
    (grpc.StatusCode.DEADLINE_EXCEEDED, 503, True),
    (grpc.StatusCode.INTERNAL, 500, False),
])
@pytest.mark.parametrize("streamed", [False, True])
def test_grpc_status_mapping(gateway, fake, code, status, retry, streamed):
    fake.error = (code, f"scheduler says {code.name}")
    payload = {"model": MODEL_NAME, "prompt": "x", "max_tokens": 2, "stream": streamed}
    r = httpx.post(f"{gateway.url}/v1/completions", json=payload)
    err = assert_error(r, status, f"scheduler says {code.name}")
    assert ("Retry-After" in r.headers) == retry
    if retry:
        assert r.headers["Retry-After"] == "1"
    assert err["code"] == status
    fake.error = None
    assert complete(gateway, prompt="x", max_tokens=1).status_code == 200


def test_scheduler_down_is_503_with_retry_after(start_gateway, fake):
    gw = start_gateway(target="127.0.0.1:1")  # nothing listens there
    r = httpx.post(f"{gw.url}/v1/completions", json={"model": MODEL_NAME, "prompt": "x", "max_tokens": 1}, timeout=30)
    assert_error(r, 503)
    assert r.headers["Retry-After"] == "1"
    status, events = stream(gw, "/v1/completions", {"model": MODEL_NAME, "prompt": "x", "stream": True})
    assert status == 503


@pytest.mark.parametrize("streamed", [False, True])
def test_one_failing_call_fails_the_request_and_cancels_the_others(gateway, fake, tokenizer, streamed):
    from tests.gateway.conftest import wait_until

    bad = tokenizer.encode("b")
    fake.error_if = lambda req: (grpc.StatusCode.INVALID_ARGUMENT, "bad prompt b") if list(
        req.input_ids.ids) == bad else None
    fake.hang = True  # the other calls would wait forever
    r = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": ["a", "b", "c"], "stream": streamed}, timeout=30)
    assert_error(r, 400, "bad prompt b")
    # The other calls were cancelled (those that reached the scheduler are recorded there).
    assert wait_until(lambda: set(fake.cancelled) >= {req.request_id for req in fake.requests
                                                      if list(req.input_ids.ids) != bad}), fake.cancelled
    assert fake.completed == []


def test_scheduler_abort_finish_is_503(gateway, fake, monkeypatch):
    original = fake._generate

    def aborting(request, ids, context, ended):
        for msg in original(request, ids, context, ended):
            if msg.finish_reason:
                msg.finish_reason = "abort"
            yield msg

    monkeypatch.setattr(fake, "_generate", aborting)
    r = complete(gateway, prompt="x", max_tokens=2)
    assert_error(r, 503, "aborted")


@pytest.mark.parametrize("streamed", [False, True])
def test_request_timeout_is_503_and_cancels(start_gateway, fake, streamed):
    from tests.gateway.conftest import wait_until

    gw = start_gateway(request_timeout_s=0.3)
    fake.hang = True
    r = httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x", "stream": streamed}, timeout=30)
    assert_error(r, 503, "request timeout (0.3 s)")
    assert r.headers["Retry-After"] == "1"
    assert wait_until(lambda: len(fake.cancelled) == 1)


def test_gateway_recovers_within_a_second_or_two_when_the_scheduler_comes_back(start_gateway, fake):
    import socket
    import time

    from codeserve.v1 import scheduler_pb2_grpc
    from common.grpc_server import start
    from tests.gateway.conftest import wait_until

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gw = start_gateway(target=f"127.0.0.1:{port}")
    payload = {"model": MODEL_NAME, "prompt": "x", "max_tokens": 1}
    # Fail for 12 s: with gRPC's default reconnect backoff (1 s growing 1.6x) the next attempt would then be
    # ~4 s away (this test fails that way); the gateway caps the backoff at 1 s.
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        assert httpx.post(f"{gw.url}/v1/completions", json=payload, timeout=30).status_code == 503
        time.sleep(0.2)
    server = start(lambda srv: scheduler_pb2_grpc.add_SchedulerServicer_to_server(fake, srv),
                   ["codeserve.v1.Scheduler"], f"127.0.0.1:{port}")
    try:
        assert wait_until(lambda: httpx.post(f"{gw.url}/v1/completions", json=payload, timeout=30).status_code == 200,
                          timeout=2.5)
    finally:
        server.server.stop(0)
