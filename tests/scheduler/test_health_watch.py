"""grpc.health.v1 ``Watch`` on the scheduler's port (public: any gRPC client, a load balancer's health checking,
``grpc-health-probe -watch``) holds nothing the other RPCs need. The scheduler's server is grpc.aio
(``common/aio_server.py``): a synchronous Watch handler ran there on the server's thread pool (32 threads), one
thread per stream blocked for the stream's life and never given back when its client left (grpcio's aio server
never calls a synchronous handler's ``add_callback``): 32 Watch streams, even closed ones, left GetLoad, Abort and
the health Check the gateway probes unanswered (DEADLINE_EXCEEDED) for good, the scheduler's exit logged 32
lingering threads, and after a failure of its loop the scheduler never exited (the interpreter's exit waited for
the pool's threads): nothing restarted it. Real processes: cache, worker, scheduler (tests/stack.py)."""

from __future__ import annotations

import json
import signal
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from codeserve.v1 import scheduler_pb2, scheduler_pb2_grpc
from common.grpc_server import channel
from launcher.config import StackConfig
from launcher.stack import Stack
from tests.scheduler.failing_loop_scheduler import FAULT_RID
from tests.stack import BACKEND, Backend, generate, status_of

WATCHERS = 40  # more than the server's 32 pool threads
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def test_watch_streams_open_or_closed_leave_the_other_rpcs_answering_and_see_the_drain(tmp_path, model_path):
    with Backend.start(tmp_path, model_path=model_path, kv_tokens=4096,
                       scheduler_args=("--drain-seconds", "1")) as be:
        chan = channel(be.stack.target("scheduler"))
        health = health_pb2_grpc.HealthStub(chan)
        try:
            for i in range(WATCHERS):  # watchers that looked once and went away
                call = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=5)
                try:
                    assert next(call).status == SERVING  # the stream reached the server
                except grpc.RpcError as err:  # was: DEADLINE_EXCEEDED from the 33rd on (no thread left)
                    raise AssertionError(f"Watch {i + 1} after {i} ended ones: {err.code()}") from None
                call.cancel()
            for name, rpc in (
                    ("GetLoad", lambda: be.scheduler.GetLoad(scheduler_pb2.GetLoadRequest(), timeout=3)),
                    ("Check", lambda: health.Check(health_pb2.HealthCheckRequest(service=""), timeout=3)),
                    ("Abort", lambda: be.scheduler.Abort(scheduler_pb2.AbortRequest(request_id="none"), timeout=3))):
                t0 = time.monotonic()
                try:
                    rpc()
                except grpc.RpcError as err:  # was: DEADLINE_EXCEEDED, every pool thread held by a Watch
                    raise AssertionError(f"{name} with {WATCHERS} Watch streams: {err.code()} after "
                                         f"{time.monotonic() - t0:.1f} s") from None
            assert generate(be.scheduler, input_ids=[5, 6, 7], max_new_tokens=3, timeout=30).finish_reason
            kept = [health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30) for _ in range(WATCHERS)]
            assert all(next(call).status == SERVING for call in kept)

            scheduler = be.stack.procs["scheduler"]
            scheduler.send_signal(signal.SIGTERM)
            for call in kept:  # the drain's NOT_SERVING reaches every watcher still there
                assert next(call).status == NOT_SERVING
            assert scheduler.wait(15) == 0
        finally:
            chan.close()
        events = [json.loads(line) for line in (tmp_path / "scheduler.log").read_text().splitlines()
                  if line.startswith("{")]
        lingering = [e for e in events if e["event"] == "lingering_threads"]
        assert not lingering, sorted(lingering[0]["threads"])  # was: 32 pool threads blocked in a Watch


def test_a_scheduler_whose_loop_failed_exits_1_with_watch_streams_open(tmp_path, model_path):
    cfg = StackConfig(http_port=0, cache_port=0, worker_port=0, scheduler_port=0, device="cpu", dtype="float32",
                      kv_tokens=4096, model_path=model_path)
    stack = Stack(cfg, tmp_path)
    try:
        stack.start(timeout=180, only=BACKEND[:2])
        argv = stack.commands()["scheduler"]
        module = argv.index("scheduler_svc")
        stack.start_one("scheduler", [*argv[:module], "tests.scheduler.failing_loop_scheduler", *argv[module + 1:]])
        chan = channel(stack.target("scheduler"))
        try:
            health = health_pb2_grpc.HealthStub(chan)
            watching = [health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60) for _ in range(4)]
            assert all(next(call).status == SERVING for call in watching)
            stub = scheduler_pb2_grpc.SchedulerStub(chan)
            code, details = status_of(lambda: generate(stub, input_ids=[5, 6, 7], max_new_tokens=8,
                                                       request_id=FAULT_RID, timeout=30))
            assert code == grpc.StatusCode.INTERNAL and "injected loop fault" in details, (code, details)
            assert all(next(call).status == NOT_SERVING for call in watching)
            scheduler = stack.procs["scheduler"]
            t0 = time.monotonic()
            while scheduler.poll() is None and time.monotonic() - t0 < 15:
                time.sleep(0.05)
            assert scheduler.poll() == 1, (  # was: no exit (4 pool threads held by the Watch streams)
                f"the scheduler did not exit 15 s after its loop failed:\n{stack.log_tail('scheduler')}")
        finally:
            chan.close()
    finally:
        stack.stop()

