"""common.poller_keeper: with a Health/Watch stream held open on a synchronous channel, ``.future()`` calls start no
thread (grpcio starts one per call whenever no other non-blocking call is open); the stream is opened again after
the server restarts, ``close`` ends it, and a NOT_SERVING status ends it (a draining server stops at once)."""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common import grpc_server
from common.poller_keeper import PollerKeeper


def threads_started_by(calls, monkeypatch) -> int:
    """How many event threads grpcio started (``_channel._run_channel_spin_thread``) while ``calls`` ran."""
    from grpc import _channel

    started = []
    original = _channel._run_channel_spin_thread
    monkeypatch.setattr(_channel, "_run_channel_spin_thread", lambda state: (started.append(1), original(state)))
    for call in calls:
        call()
    monkeypatch.setattr(_channel, "_run_channel_spin_thread", original)
    return len(started)


def wait_until(pred, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"not {what} within {timeout} s"
        time.sleep(0.01)


def test_future_calls_start_no_thread_while_the_stream_is_held(monkeypatch) -> None:
    server = grpc_server.start(lambda s: None, [], "127.0.0.1:0")
    chan = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub = health_pb2_grpc.HealthStub(chan)
    req = health_pb2.HealthCheckRequest()
    try:
        one = lambda: stub.Check.future(req).result(timeout=5)  # noqa: E731
        one()
        assert threads_started_by([one] * 20, monkeypatch) >= 10  # without it: a thread nearly every call
        keeper = PollerKeeper(chan)
        wait_until(lambda: keeper.held, "the stream open")
        one()
        assert threads_started_by([one] * 20, monkeypatch) == 0
        keeper.close()
        wait_until(lambda: not keeper.held, "the stream closed")
    finally:
        chan.close()
        server.server.stop(0)


def test_the_stream_is_opened_again_after_the_server_restarts() -> None:
    server = grpc_server.start(lambda s: None, [], "127.0.0.1:0")
    port = server.port
    chan = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_reconnect_backoff_ms", 200),
                                                               ("grpc.initial_reconnect_backoff_ms", 100),
                                                               ("grpc.min_reconnect_backoff_ms", 100)])
    keeper = PollerKeeper(chan)
    try:
        # the stream must have reached the server: one still waiting for it (wait_for_ready) does not end when the
        # server stops, it waits on (CI failed here when the stop came before the stream was answered)
        wait_until(lambda: keeper.answered >= 1, "the stream answered")
        first = keeper._call
        server.server.stop(0).wait()
        wait_until(lambda: keeper._call is not first, "a new stream after the server went away")
        assert keeper.held  # waiting for the server (wait_for_ready), not failed
        server = grpc_server.start(lambda s: None, [], f"127.0.0.1:{port}")
        stub = health_pb2_grpc.HealthStub(chan)
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=10, wait_for_ready=True).status == \
            health_pb2.HealthCheckResponse.SERVING
        assert keeper.held
    finally:
        keeper.close()
        chan.close()
        server.server.stop(0)


def test_a_draining_server_stops_without_waiting_for_the_stream() -> None:
    # the server says NOT_SERVING and stops with a grace period (as every service drains): the keeper ends its stream,
    # so the stop does not wait the whole grace for it (it did: 3.0 s of a 3 s grace, the cache's every restart)
    server = grpc_server.start(lambda s: None, [], "127.0.0.1:0")
    chan = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    keeper = PollerKeeper(chan)
    try:
        wait_until(lambda: keeper.answered >= 1, "the stream answered")
        server.set_serving(False)
        wait_until(lambda: keeper.answered >= 2, "NOT_SERVING read")
        t0 = time.monotonic()
        server.server.stop(3.0).wait()
        assert time.monotonic() - t0 < 1.0
    finally:
        keeper.close()
        chan.close()
        server.server.stop(0)
