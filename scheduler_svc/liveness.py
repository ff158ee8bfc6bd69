"""Scheduler-side liveness of the worker: is the worker process answering at all?

A Forward may legitimately take tens of seconds (a first flashinfer JIT compile, a long CPU prefill), so the
Forward deadline (120 s) cannot tell a slow worker from a frozen one (SIGSTOP, wedged in a driver call). The
worker's gRPC server threads answer grpc.health.v1 ``Check`` while a Forward computes: torch releases the GIL
in its kernels (measured on the 2-core CPU box, default model: an 8-item x 4000-token extend ran 8.2-8.4 s
while health checks every 0.1 s were answered in 1.5-2 ms median, 15 ms at most). A frozen process answers
nothing: a Check on an open connection, or on a new one (the kernel still accepts it), ends with
DEADLINE_EXCEEDED after its deadline. A dead process refuses the connection (UNAVAILABLE at once): that is an
outage, handled by the scheduler's outage path (``--outage-timeout``), not a stall.

``WorkerLiveness`` probes every ``interval_s`` with a ``timeout_s`` deadline on a daemon thread and keeps the
monotonic time of the last answer. Defaults 1 s / 2 s; the scheduler's stall timeout defaults to 10 s
(``--worker-stall-timeout``), 5x the probe deadline and several hundred times the slowest answer measured
under load, so a busy worker is never taken for a frozen one.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# The process did not answer (frozen); anything else that ends a Check is an answer or an outage.
NO_ANSWER = (grpc.StatusCode.DEADLINE_EXCEEDED,)


class WorkerLiveness:
    """Probes one worker's grpc.health.v1 ``Check`` and says how long it has not answered.

    ``stub``: an object with ``Check(HealthCheckRequest, timeout=seconds)`` (a ``HealthStub``; tests pass a
    fake). ``interval_s``: seconds between probe starts; ``timeout_s``: each probe's deadline in seconds;
    ``stall_timeout_s``: seconds without an answer after which ``stalled()`` is True (> 0); ``clock``: monotonic
    seconds (``time.monotonic``; tests pass a fake). Thread-safe: the probe thread writes, any thread reads.

    An answer is any HealthCheckResponse (SERVING or not: a draining worker still runs). A probe that ends with
    DEADLINE_EXCEEDED is no answer. Any other RPC error (UNAVAILABLE: nothing listens, the process is dead) is
    not an answer either, but it is not a stall: ``stalled()`` stays False and the outage path deals with it.
    """

    def __init__(self, stub, interval_s: float = 1.0, timeout_s: float = 2.0, stall_timeout_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s <= 0 or timeout_s <= 0 or stall_timeout_s <= 0:
            raise ValueError(f"interval_s {interval_s}, timeout_s {timeout_s} and stall_timeout_s {stall_timeout_s} "
                             f"must be > 0")
        self.stub, self.interval_s, self.timeout_s = stub, interval_s, timeout_s
        self.stall_timeout_s, self.clock = stall_timeout_s, clock
        self._lock = threading.Lock()
        self._last_answer = clock()  # the scheduler starts after the worker answered Info
        self._last_failure: grpc.StatusCode | None = None  # of the latest probe; None when it answered
        self._last_error = ""
        self._refusal_seen = False  # a probe was refused since the last ``take_refusal``
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_target(cls, target: str, **kw) -> "WorkerLiveness":
        """A monitor of the worker at ``target`` (host:port) over its own connection (a local subchannel pool:
        health checks never queue behind Forward payloads on the scheduler's channel). ``kw``: as ``__init__``."""
        chan = grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1),
                                                      ("grpc.initial_reconnect_backoff_ms", 100),
                                                      ("grpc.min_reconnect_backoff_ms", 100),
                                                      ("grpc.max_reconnect_backoff_ms", 1000)])
        return cls(health_pb2_grpc.HealthStub(chan), **kw)

    def probe_once(self) -> bool:
        """One ``Check`` with the ``timeout_s`` deadline; True when the worker answered (the time is recorded)."""
        try:
            self.stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=self.timeout_s)
        except grpc.RpcError as err:
            with self._lock:
                self._last_failure = err.code()
                self._last_error = f"{err.code().name}: {err.details()}"
                self._refusal_seen = self._refusal_seen or err.code() == grpc.StatusCode.UNAVAILABLE
            return False
        with self._lock:
            self._last_answer, self._last_failure, self._last_error = self.clock(), None, ""
        return True

    def unresponsive_for(self) -> float:
        """Seconds since the last answer (since construction when none came yet)."""
        with self._lock:
            return max(0.0, self.clock() - self._last_answer)

    def stalled(self) -> bool:
        """True when the worker has not answered for more than ``stall_timeout_s`` and the latest probe ended
        without an answer (DEADLINE_EXCEEDED: frozen), not with a refused connection (dead: an outage)."""
        with self._lock:
            silent = self.clock() - self._last_answer
            return silent > self.stall_timeout_s and self._last_failure in NO_ANSWER

    def refused(self) -> bool:
        """True when the latest probe was refused (UNAVAILABLE: nothing listens, a dead worker), not answered."""
        with self._lock:
            return self._last_failure == grpc.StatusCode.UNAVAILABLE

    def take_refusal(self) -> bool:
        """True once for each run of refused probes (UNAVAILABLE: the worker died, and may be back by now with a new
        epoch), then False until a probe is refused again."""
        with self._lock:
            seen, self._refusal_seen = self._refusal_seen, False
            return seen

    @property
    def last_error(self) -> str:
        """``CODE: details`` of the latest probe, "" when it answered."""
        with self._lock:
            return self._last_error

    def start(self) -> "WorkerLiveness":
        """Starts the daemon probe thread (once; the silence is counted from now); returns self."""
        if self._thread is None:
            with self._lock:
                self._last_answer = self.clock()
            self._thread = threading.Thread(target=self._run, name="worker-liveness", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the probe thread after its current probe (at most ``timeout_s`` later)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = self.clock()
            self.probe_once()
            self._stop.wait(max(0.0, self.interval_s - (self.clock() - started)))
