"""``common.grpc_server.lingering_threads``: after a server stopped, idle handler threads go at once, and a
thread that would hold up the interpreter's exit is named with its stack (the scheduler logs it and exits
instead of hanging after its drain)."""

from __future__ import annotations

import threading

from common import grpc_server
from grpc_health.v1 import health_pb2, health_pb2_grpc


def test_an_idle_stopped_server_leaves_no_thread_behind():
    running = grpc_server.start(lambda s: None, [], "127.0.0.1:0")
    stub = health_pb2_grpc.HealthStub(grpc_server.channel(f"127.0.0.1:{running.port}"))
    assert stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
    running.server.stop(grace=1.0).wait(2.0)
    assert grpc_server.lingering_threads(running, seconds=5.0) == {}


def test_a_handler_that_does_not_return_is_named_with_its_stack():
    running = grpc_server.start(lambda s: None, [], "127.0.0.1:0")
    release = threading.Event()
    running.executor.submit(release.wait, 30)  # as a handler blocked on a request that never ends
    try:
        running.server.stop(grace=0).wait(2.0)
        lingering = grpc_server.lingering_threads(running, seconds=0.2)
        assert len(lingering) == 1
        (name, stack), = lingering.items()
        assert name.startswith(running.thread_prefix + "_") and "in wait" in stack
    finally:
        release.set()
