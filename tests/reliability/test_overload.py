"""Overload over HTTP: the waiting queue is bounded in requests (--max-queued-requests) and in prompt tokens
(--max-queued-tokens); beyond them 429 with Retry-After naming the limit. Deadlines propagate: the gateway's
--request-timeout becomes the gRPC deadline, and when it passes the scheduler aborts the request, waiting or
running, and frees its slots."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.reliability.client import generate
from tests.reliability.conftest import prompts
from tests.reliability.system import wait_for

TIMEOUT = 6.0  # the gateway's --request-timeout: A holds the one running slot this long, so every queue
# state below must be reached within it (a loaded 2-core machine needs more than the ~0.5 s it takes idle)
A_NEW = 4000  # A must still be decoding at its deadline: ~250 tokens/s here, 4008 < n_positions 4096


@pytest.fixture(scope="module")
def sys_(systems):
    return systems(kv_tokens=4096, max_running_requests=1, max_queued_requests=3,
                   scheduler_args=("--max-queued-tokens", "100"),
                   gateway_args=("--request-timeout", str(TIMEOUT)))


def background(fn, *args, **kw):
    box: list = []
    thread = threading.Thread(target=lambda: box.append(fn(*args, **kw)), daemon=True)
    thread.start()
    return thread, box


def test_queue_bounds_in_requests_and_tokens_then_deadlines_abort_everything(sys_, settled):
    settled(sys_)
    p40 = prompts(4, 40, seed=6)
    started = [background(generate, sys_.url, prompts(1, 8, seed=7)[0], A_NEW, rid="ov-a")]
    wait_for(lambda: sys_.be.load().running == 1, TIMEOUT, "A running")
    started += [background(generate, sys_.url, p40[i], 2000, rid=f"ov-{i}") for i in range(2)]
    wait_for(lambda: sys_.be.load().waiting == 2, TIMEOUT, "two waiting (80 prompt tokens)")
    too_many_tokens = generate(sys_.url, p40[2], 5, stream=False)
    assert too_many_tokens.status == 429 and too_many_tokens.retry_after, too_many_tokens
    assert "limit of 100 queued tokens" in too_many_tokens.error, too_many_tokens
    started.append(background(generate, sys_.url, p40[3][:10], 2000, rid="ov-small"))  # 90 tokens: still fits
    wait_for(lambda: sys_.be.load().waiting == 3, TIMEOUT, "three waiting")
    too_many = generate(sys_.url, [11, 12], 5, stream=False)
    assert too_many.status == 429 and too_many.retry_after and "queue is full (3 requests)" in too_many.error
    for thread, _ in started:
        thread.join(TIMEOUT + 30)
    outs = [box[0] for _, box in started]
    for out in outs:  # every one hit the gateway's request timeout: 503 (or an error event once streaming)
        assert out.status in (200, 503) and "request timeout" in out.error, out
        assert out.seconds < TIMEOUT + 3, out  # ended by its own deadline (each call's clock starts when it is sent)
    wait_for(lambda: sys_.be.load().running + sys_.be.load().waiting == 0, 10, "the scheduler dropped them all")
    log = [json.loads(line) for line in (sys_.be.stack.log_dir / "scheduler.log").read_text().splitlines()
           if line.startswith("{")]
    aborted = {e["rid"] for e in log if e.get("event") == "aborted"}
    assert {"ov-a", "ov-0", "ov-1", "ov-small"} <= aborted, aborted
    finished = {e["rid"] for e in log if e.get("event") == "finished"}
    assert not finished & {"ov-a", "ov-0", "ov-1", "ov-small"}
    print(f"\noverload: 429 for tokens ({too_many_tokens.error!r}) and count ({too_many.error!r}); all four "
          f"requests ended by the {TIMEOUT} s deadline (slowest call {max(o.seconds for o in outs):.2f} s) and "
          f"were aborted at the scheduler")


def test_one_request_of_several_prompts_over_the_limits_runs_when_nothing_else_waits(sys_, settled):
    """A prompt list whose generations alone pass both limits (5 prompts of 40 tokens against 3 queued requests and
    100 queued tokens) is taken whole on an idle server: the limits apply to its first call, the others queue with
    it (scheduler_svc/group_admission.py). Was: each call checked alone, so the 3rd or 4th was refused with a 429
    that no retry could pass (the queue held only its own siblings), and the others were aborted as siblings."""
    settled(sys_)
    wait_for(lambda: sys_.be.load().running + sys_.be.load().waiting == 0, 10, "an idle scheduler")
    batch = prompts(5, 40, seed=11)
    for stream in (False, True):
        body = {"prompt": batch, "max_tokens": 2, "temperature": 0, "stream": stream}
        r = httpx.post(f"{sys_.url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        if stream:
            events = [json.loads(line[6:]) for line in r.text.splitlines()
                      if line.startswith("data: {") and '"choices"' in line]
            assert {c["index"] for e in events for c in e["choices"]} == set(range(5)), r.text
        else:
            choices = r.json()["choices"]
            assert [c["index"] for c in choices] == list(range(5)) and all(c["finish_reason"] in ("length", "stop")
                                                                          for c in choices), choices
    wait_for(lambda: sys_.be.load().running + sys_.be.load().waiting == 0, 10, "the scheduler idle again")
