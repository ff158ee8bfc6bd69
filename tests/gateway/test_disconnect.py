"""A client that goes away cancels its gRPC call(s) at the scheduler, streamed or not, while waiting
for the first token or mid-stream (real uvicorn, real gRPC; the fake records cancelled calls)."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.gateway.conftest import MODEL_NAME, wait_until


def _long(stream: bool, n: int = 1) -> dict:
    return {"model": MODEL_NAME, "prompt": "def f():", "max_tokens": 50, "ignore_eos": True, "stream": stream, "n": n}


def test_stream_disconnect_mid_stream_cancels(gateway, fake):
    fake.token_delay_s = 0.05
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=_long(True)) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    assert wait_until(lambda: len(fake.cancelled) == 1), "the gRPC call was not cancelled"
    assert fake.cancelled == [fake.requests[0].request_id]
    assert fake.completed == []


def test_stream_disconnect_during_a_long_gap_cancels_without_waiting_for_the_next_token(gateway, fake):
    fake.token_delay_s = 30  # the next token would come much later than the wait below
    with httpx.stream("POST", f"{gateway.url}/generate",
                      json={"text": "def f():", "stream": True,
                            "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}}) as r:
        assert r.status_code == 200
        assert next(r.iter_lines()).startswith("data: ")
    assert wait_until(lambda: len(fake.cancelled) == 1, timeout=10)


@pytest.mark.parametrize("streamed", [False, True])
def test_disconnect_while_waiting_for_the_first_token_cancels(gateway, fake, streamed):
    fake.hang = True  # the request waits in the queue forever
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gateway.url}/v1/completions", json=_long(streamed, n=2), timeout=httpx.Timeout(5, read=0.5))
    assert wait_until(lambda: len(fake.cancelled) == 2, timeout=10), fake.cancelled
    assert sorted(fake.cancelled) == sorted(r.request_id for r in fake.requests)


def test_nonstream_disconnect_mid_generation_cancels(gateway, fake):
    fake.token_delay_s = 0.05
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gateway.url}/generate", json={"text": ["a", "b"], "sampling_params": {
            "max_new_tokens": 200, "ignore_eos": True}}, timeout=httpx.Timeout(5, read=0.5))
    assert wait_until(lambda: len(fake.cancelled) == 2, timeout=10), fake.cancelled
    assert fake.completed == []


def test_openai_client_breaking_out_of_a_stream_cancels(gateway, fake):
    import openai

    fake.token_delay_s = 0.05
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused")
    stream = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=100, stream=True, extra_body={"ignore_eos": True})
    for i, _chunk in enumerate(stream):
        if i == 2:
            break
    stream.close()
    assert wait_until(lambda: len(fake.cancelled) == 1, timeout=10)
    assert fake.completed == []


@pytest.mark.parametrize("streamed", [False, True])
def test_completed_requests_are_not_reported_cancelled(gateway, fake, streamed):
    for _ in range(5):
        r = httpx.post(f"{gateway.url}/v1/completions", json=_long(streamed, n=2))
        assert r.status_code == 200
    assert wait_until(lambda: len(fake.completed) == 10)
    assert fake.cancelled == []


@pytest.mark.parametrize("streamed", [False, True])
def test_the_answer_ends_at_the_last_message_without_waiting_for_the_calls_status(gateway, fake, streamed):
    """The scheduler's call stays open after its last message (its status held back): the answer (the stream's
    [DONE], or the whole JSON body) is complete anyway, and once the status comes the call ends completed, never
    cancelled. Before, the gateway waited for the status first: ~7 ms p50 after the last message at a c64 wave's
    end (H100 run 30), on the path to the client's next request."""
    fake.hold_after_last = threading.Event()
    try:
        with httpx.Client(timeout=10) as client:
            r = client.post(f"{gateway.url}/v1/completions", json=_long(streamed, n=2))
        assert r.status_code == 200
        assert r.text.rstrip().endswith("data: [DONE]") if streamed else r.json()["choices"][1]["finish_reason"]
        assert fake.completed == [] and fake.cancelled == []  # both calls still open
    finally:
        fake.hold_after_last.set()
    assert wait_until(lambda: len(fake.completed) == 2)
    assert fake.cancelled == []


@pytest.mark.parametrize("streamed", [False, True])
def test_a_failed_fan_out_tells_the_scheduler_why_it_cancels_the_others(gateway, fake, streamed):
    """n = 3, the second call refused (429): before cancelling the other two, the gateway sends each an Abort with
    sibling_failed, so the scheduler counts them apart from client aborts. Was: plain cancels, counted as client
    aborts (one 429 showed as +192 aborts)."""
    import grpc

    fake.token_delay_s = 0.2  # the siblings are still running when the second call fails
    fake.error_if = lambda req: ((grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
                                 if req.request_id.endswith("-1") else None)
    with httpx.stream("POST", f"{gateway.url}/v1/completions", timeout=30,
                      json={"model": MODEL_NAME, "prompt": "x", "n": 3, "max_tokens": 30, "stream": streamed}) as r:
        r.read()
    assert r.status_code == 429, r.text
    ids = sorted(req.request_id for req in fake.requests)
    siblings = [rid for rid in ids if not rid.endswith("-1")]
    assert len(ids) == 3 and len(siblings) == 2
    assert sorted(fake.aborted) == [(rid, True) for rid in siblings]
    assert wait_until(lambda: sorted(fake.cancelled) == siblings)  # and then cancelled, as before


def test_a_fan_out_stream_failing_mid_way_tells_the_scheduler_why_it_cancels_the_others(gateway, fake):
    """The same for a failure after the streams opened (merge_streams): a 200 stream that ends in an error event,
    the other calls sent an Abort with sibling_failed before their cancel."""
    import grpc

    fake.token_delay_s = 0.2
    fake.error_after_first_if = lambda req: ((grpc.StatusCode.INTERNAL, "worker lost")
                                             if req.request_id.endswith("-1") else None)
    with httpx.stream("POST", f"{gateway.url}/v1/completions", timeout=30,
                      json={"model": MODEL_NAME, "prompt": "x", "n": 3, "max_tokens": 30, "stream": True}) as r:
        body = r.read().decode()
    assert r.status_code == 200 and "worker lost" in body, body
    siblings = sorted(req.request_id for req in fake.requests if not req.request_id.endswith("-1"))
    assert len(siblings) == 2
    assert sorted(fake.aborted) == [(rid, True) for rid in siblings]
    assert wait_until(lambda: sorted(fake.cancelled) == siblings)
