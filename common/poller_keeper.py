"""Keeps a synchronous gRPC channel's event thread alive, so a ``.future()`` call does not start a thread.

grpcio's synchronous channel runs the events of its non-blocking calls (``stub.Method.future(...)``, streams) on a
thread it starts when the first such call begins and ends when the last one completes (``_channel.py``:
``_run_channel_spin_thread``). The scheduler sends its Forwards with ``.future()``; one sent when none is in flight
(the first extend after an idle moment) started, and joined the GIL with, a new thread: a local round trip took
620-920 us through ``future()`` against 210-260 us with a call held open (200 us blocking) on the idle 2-core box,
593-632 against 510-524 us with the box busy (``bench/future_call_bench.py``).
``PollerKeeper`` holds one call open on the channel for its lifetime: a ``grpc.health.v1.Health/Watch`` stream,
which the server answers only when the serving status changes, opened with ``wait_for_ready`` (while the server is
down it waits instead of failing) and opened again when it ends (a restarted server).
"""

from __future__ import annotations

import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


REOPEN_PAUSE_S = 0.05  # between a stream's end and the next one (a server that refuses Watch cannot make it spin)
# after a stream the keeper ended itself because the server said NOT_SERVING (it is draining: an open stream would
# hold its graceful stop for the whole grace period); it is opened again then, and the server answers what it is
NOT_SERVING_PAUSE_S = 0.5


class PollerKeeper:
    """Holds a Health/Watch stream open on ``channel`` until ``close``, from a daemon thread that reads it (one
    message per serving-status change, a few bytes; a stream whose messages are not read never sees its end)
    and opens it again when it ends (it then waits for the server while it is unreachable). A NOT_SERVING status
    ends the stream from this side (a draining server's ``stop(grace)`` would wait the whole grace for it)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._stub = health_pb2_grpc.HealthStub(channel)
        self._lock = threading.Lock()
        self._closed = False
        self._call = None
        self.answered = 0  # messages read over all streams (a stream's first one: it reached the server)
        self._thread = threading.Thread(target=self._hold, name="grpc-poller-keeper", daemon=True)
        self._thread.start()

    def _hold(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                call = self._call = self._stub.Watch(health_pb2.HealthCheckRequest(service=""), wait_for_ready=True)
            pause = REOPEN_PAUSE_S
            try:
                for message in call:
                    self.answered += 1
                    if message.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                        call.cancel()  # ends the iteration with CANCELLED
                        pause = NOT_SERVING_PAUSE_S
            except grpc.RpcError:
                pass  # the stream ended (the server went away, or ``close``): that is what this loop waits for
            time.sleep(pause)

    @property
    def held(self) -> bool:
        """True while a stream is open (not yet ended), including one still waiting for the server (it keeps the
        event thread alive all the same); ``answered`` > 0 once a stream reached the server."""
        call = self._call
        return call is not None and not call.done()

    def close(self) -> None:
        """Ends the stream (before the channel is closed) and the thread."""
        with self._lock:
            self._closed = True
            call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(timeout=5)
