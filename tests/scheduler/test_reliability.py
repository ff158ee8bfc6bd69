"""Queue bound, progress health, worker and cache restarts, outages, disconnects while queued (R2 at gRPC level)."""

import signal
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from codeserve.v1 import scheduler_pb2
from tests.scheduler import hf
from tests.stack import Backend, generate, request, status_of

PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, model_path):
    be = Backend.start(tmp_path_factory.mktemp("tiny-logs"), model_path=model_path, kv_tokens=4096,
                       max_running_requests=1, max_queued_requests=2, progress_timeout=2.0, lease_seconds=2.0,
                       scheduler_args=("--outage-timeout", "6", "--lease-seconds", "2"))
    yield be
    codes = be.stop()
    assert codes["scheduler"] == 0, be.stack.log_tail("scheduler")  # SIGTERM drains and exits 0


def health(be: Backend) -> int:
    stub = health_pb2_grpc.HealthStub(be._channels[0])
    return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout} s")
        time.sleep(0.1)


def start_stream(be, rid, n):
    return be.scheduler.Generate(request(input_ids=PROMPT, max_new_tokens=n, ignore_eos=True, request_id=rid),
                                 timeout=120)


def test_r2_bounded_queue_and_a_dropped_waiting_request_never_runs(tiny):
    a = start_stream(tiny, "r2-a", 2000)
    next(a)
    b = start_stream(tiny, "r2-b", 5)
    c = start_stream(tiny, "r2-c", 5)
    wait_for(lambda: tiny.load().waiting == 2, 10, "two waiting")
    code, details = status_of(lambda: generate(tiny.scheduler, input_ids=PROMPT, max_new_tokens=1))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "queue is full (2 requests)" in details
    b.cancel()
    a.cancel()
    assert sum(len(m.token_ids) for m in c) == 5
    log = tiny.stack.log_tail("scheduler", 100000)
    assert '"rid": "r2-c", "tokens"' in log and '"rid": "r2-b", "tokens"' not in log  # B was never admitted
    tiny.idle_check()


def test_health_reports_no_progress_while_the_worker_is_stopped(tiny, model_path):
    assert health(tiny) == health_pb2.HealthCheckResponse.SERVING
    worker = tiny.stack.procs["worker"]
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(r=generate(tiny.scheduler, input_ids=PROMPT,
                                                                   max_new_tokens=40, ignore_eos=True)))
    worker.send_signal(signal.SIGSTOP)
    try:
        thread.start()
        wait_for(lambda: health(tiny) == health_pb2.HealthCheckResponse.NOT_SERVING, 10, "NOT_SERVING")
        assert tiny.load().seconds_since_last_batch > 2.0
    finally:
        worker.send_signal(signal.SIGCONT)
    thread.join(60)
    assert out["r"].token_ids == hf.greedy(model_path, PROMPT, 40, eos=None)[0]
    wait_for(lambda: health(tiny) == health_pb2.HealthCheckResponse.SERVING, 10, "SERVING again")


def test_scheduler_paused_past_its_lease_resyncs_and_finishes_unchanged(tiny, model_path):
    stream = start_stream(tiny, "paused-1", 120)
    got = list(next(stream).token_ids)
    sched = tiny.stack.procs["scheduler"]
    sched.send_signal(signal.SIGSTOP)
    time.sleep(4)  # the cache expires the 2 s lease and releases the session's locks and slots
    sched.send_signal(signal.SIGCONT)
    for msg in stream:
        got += msg.token_ids
    assert got == hf.greedy(model_path, PROMPT, 120, eos=None)[0]
    assert "expired" in tiny.stack.log_tail("scheduler", 100000)
    tiny.idle_check()


def test_worker_restart_mid_generation_requeues_and_recomputes_the_same_output(tiny, model_path):
    stream = start_stream(tiny, "restart-1", 300)
    got = list(next(stream).token_ids)
    for msg in stream:
        got += msg.token_ids
        if len(got) >= 20:
            break
    tiny.stack.kill("worker")
    tiny.stack.start_one("worker")
    for msg in stream:
        got += msg.token_ids
    assert got == hf.greedy(model_path, PROMPT, 300, eos=None)[0]
    log = tiny.stack.log_tail("scheduler", 100000)
    assert '"event": "resynced"' in log
    tiny.idle_check()


def test_cache_restart_is_resynced_and_serving_continues(tiny, model_path):
    tiny.stack.kill("cache")
    tiny.stack.start_one("cache")
    out = generate(tiny.scheduler, input_ids=PROMPT, max_new_tokens=10, ignore_eos=True)
    assert out.token_ids == hf.greedy(model_path, PROMPT, 10, eos=None)[0]
    tiny.idle_check()


def test_cache_outage_fails_requests_with_a_clear_error_then_recovers(tiny):
    tiny.stack.kill("cache")
    try:
        code, details = status_of(lambda: generate(tiny.scheduler, input_ids=PROMPT, max_new_tokens=3, timeout=60))
        assert code == grpc.StatusCode.UNAVAILABLE and "cache service at" in details and "unavailable" in details
    finally:
        tiny.stack.start_one("cache")
    out = generate(tiny.scheduler, input_ids=PROMPT, max_new_tokens=2, ignore_eos=True)  # served again
    assert out.completion_tokens == 2
    tiny.idle_check()
