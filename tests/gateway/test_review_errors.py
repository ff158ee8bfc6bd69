"""Fresh-user review: clear messages after a scheduler crash (kill -9) and small input-validation gaps
(empty / non-UTF-8 body, chat message without content, logprob_start_len range, every sampling_params error)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import httpx
import pytest

from gateway.errors import from_grpc
from tests.gateway.conftest import MODEL_NAME
from tests.gateway.test_errors import assert_error

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_scheduler_killed_mid_request_then_unreachable_is_named(start_gateway):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.gateway.dying_scheduler", str(port)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout.readline().strip() == "serving"
        target = f"127.0.0.1:{port}"
        gw = start_gateway(target=target, probe_interval_s=0)  # no health probe: the calls themselves fail
        payload = {"model": MODEL_NAME, "prompt": "x", "max_tokens": 2}
        answer: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: answer.append(
            httpx.post(f"{gw.url}/v1/completions", json=payload, timeout=30)))
        thread.start()
        assert proc.stdout.readline().startswith("generating ")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        thread.join(30)
        err = assert_error(answer[0], 503, f"the scheduler at {target} went away while this request ran",
                           "the request was not completed: retry", "[gRPC: ")
        assert err["type"] == "service_unavailable" and err["param"] is None
        assert answer[0].headers["Retry-After"] == "1"
        r = httpx.post(f"{gw.url}/v1/completions", json=payload, timeout=30)
        assert_error(r, 503, f"the scheduler at {target} is unreachable (connection refused); retry later",
                     "[gRPC: failed to connect to all addresses")
    finally:
        proc.kill()
        proc.wait(10)


def test_a_stream_the_scheduler_dies_under_is_counted_once(start_gateway):
    """The reviewer's kill -9 mid-stream: the stream ends with a 503 error event, counted in the gateway's
    codeserve:request_errors (no scheduler is left to count it). Was: counted nowhere (the non-streamed answer
    next to it was a counted 503)."""
    from tests.gateway.test_admin import _samples

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.gateway.dying_scheduler", str(port)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout.readline().strip() == "serving"
        gw = start_gateway(target=f"127.0.0.1:{port}", probe_interval_s=0)
        payload = {"model": MODEL_NAME, "prompt": "x", "max_tokens": 100, "ignore_eos": True, "stream": True}
        whole: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: whole.append(httpx.post(
            f"{gw.url}/v1/completions", json={**payload, "stream": False}, timeout=30)))
        with httpx.stream("POST", f"{gw.url}/v1/completions", json=payload, timeout=30) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")  # the first chunk: it runs
            assert proc.stdout.readline().startswith("generating ")
            thread.start()
            assert proc.stdout.readline().startswith("generating ")
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            rest = [line for line in lines if line.startswith("data: ")]
        thread.join(30)
        assert whole[0].status_code == 503
        assert json.loads(rest[0][len("data: "):])["error"]["code"] == 503 and rest[-1] == "data: [DONE]", rest
        s = _samples(httpx.get(f"{gw.url}/metrics", timeout=30).text)
        assert s["codeserve:scheduler_up"] == 0
        assert s["codeserve:request_errors_total|status=503|type=service_unavailable"] == 2  # both, once each
    finally:
        proc.kill()
        proc.wait(10)


def test_scheduler_own_unavailable_message_passes_unchanged():
    msg = "worker w0 has not answered health checks for 3.0 s (frozen?)"
    assert from_grpc(grpc.StatusCode.UNAVAILABLE, msg, 1, "127.0.0.1:50053").message == msg
    # a transport-looking text under another code is not rewritten either
    assert from_grpc(grpc.StatusCode.INTERNAL, "Socket closed", 1, "h:1").message == "scheduler error INTERNAL: Socket closed"
    lost = from_grpc(grpc.StatusCode.UNAVAILABLE, "Stream removed", 1, "127.0.0.1:50053").message
    assert lost == ("the scheduler at 127.0.0.1:50053 went away while this request ran (Stream removed); "
                    "the request was not completed: retry [gRPC: Stream removed]")


@pytest.mark.parametrize("body", [b"", b"\xff\xfe{\"prompt\": \"a\"}", b"{\"prompt\": \"\xe9\"}"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/generate"])
def test_empty_or_non_utf8_body_is_not_valid_json(gateway, fake, body, path):
    r = httpx.post(f"{gateway.url}{path}", content=body, headers={"content-type": "application/json"})
    err = assert_error(r, 400, param=None)
    assert err["message"].startswith("request body is not valid JSON: "), err["message"]
    assert err["param"] is None
    if not body:
        assert "empty" in err["message"]
    else:
        assert "UTF-8" in err["message"]
    assert fake.requests == []


@pytest.mark.parametrize("message,param", [
    ({"role": "user"}, "messages[0].content"),
    ({"role": "user", "content": None}, "messages[0].content"),
    ({"role": "assistant"}, "messages[0].content"),
    ({"role": "user", "content": []}, "messages[0].content"),  # was accepted as "" (OpenAI: min 1 part)
])
def test_chat_message_without_content_is_400(gateway, fake, message, param):
    r = httpx.post(f"{gateway.url}/v1/chat/completions", json={"messages": [message], "max_tokens": 1})
    assert_error(r, 400, param, "content", param=param)
    r = httpx.post(f"{gateway.url}/v1/chat/completions",
                   json={"messages": [{"role": "system", "content": "hi"}, message], "max_tokens": 1})
    assert_error(r, 400, param=param.replace("[0]", "[1]"))
    assert fake.requests == []


@pytest.mark.parametrize("value", [-5, -2])
def test_negative_logprob_start_len_other_than_minus_one_is_400(gateway, fake, value):
    r = httpx.post(f"{gateway.url}/generate", json={"text": "def f():", "return_logprob": True,
                                                    "logprob_start_len": value})
    assert_error(r, 400, "logprob_start_len", str(value), param="logprob_start_len")
    assert fake.requests == []


def test_logprob_start_len_past_the_prompt_is_400_naming_its_length(gateway, fake):
    ids = [5, 6, 7]
    for value in (3, 10):
        r = httpx.post(f"{gateway.url}/generate", json={"input_ids": ids, "return_logprob": True,
                                                        "logprob_start_len": value})
        assert_error(r, 400, "logprob_start_len", str(value), "3 tokens", param="logprob_start_len")
    r = httpx.post(f"{gateway.url}/generate", json={"input_ids": [[5, 6, 7, 8], [5, 6]], "return_logprob": True,
                                                    "logprob_start_len": 2})
    assert_error(r, 400, "input_ids[1]", "2 tokens", param="logprob_start_len")
    assert fake.requests == []
    ok = httpx.post(f"{gateway.url}/generate", json={"input_ids": ids, "return_logprob": True,
                                                     "logprob_start_len": 2, "sampling_params": {"max_new_tokens": 1}})
    assert ok.status_code == 200, ok.text
    assert [t[1] for t in ok.json()["meta_info"]["input_token_logprobs"]] == [7]


def test_every_sampling_params_error_is_listed_with_its_path(gateway, fake):
    r = httpx.post(f"{gateway.url}/generate", json={"text": "a", "sampling_params": {"temperature": -1, "top_k": -3}})
    err = assert_error(r, 400, "sampling_params.temperature:", "sampling_params.top_k:",
                       param="sampling_params.temperature")
    assert "more errors" not in err["message"]
    assert err["message"].count("; ") == 1, err["message"]
    r = httpx.post(f"{gateway.url}/generate", json={"text": "a", "sampling_params": {"top_p": 0, "regex": "x"}})
    err = assert_error(r, 400, "sampling_params.top_p:", "sampling_params.regex:", param="sampling_params.top_p")
    assert "more errors" not in err["message"]
    # a list of params: each entry's path carries its index
    r = httpx.post(f"{gateway.url}/generate", json={"text": ["a", "b"], "sampling_params": [{}, {"min_p": 2}]})
    err = assert_error(r, 400, "sampling_params[1].min_p:", param="sampling_params[1].min_p")
    assert "more errors" not in err["message"]
    assert fake.requests == []
