"""Request metrics of every Generate call, kept where every request passes: the scheduler's servicer.

A request over HTTP (the gateway makes one Generate call per prompt and choice) and one sent to the public
gRPC API directly are counted alike. Each call is counted exactly once, when it ends:

- ``vllm:request_success_total{finished_reason}``: the call delivered its last message, with finish reason
  "stop", "length" or "abort". "abort" is a call ended before it finished: its client went away (an HTTP
  client that closed its stream or its connection: the gateway cancels the call; a gRPC client that
  cancelled), an ``Abort`` RPC, or a generator closed by gRPC before its last message was delivered;
  ``codeserve:sibling_aborts_total`` counts those of them the gateway ended because another call of the same
  HTTP request failed (its ``Abort`` with ``sibling_failed`` before it cancels): not client aborts;
- ``codeserve:generate_errors_total{code}``: the call ended with an error status (its gRPC code name:
  INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE, ALREADY_EXISTS, INTERNAL, ...).

Latencies (seconds, from the call's arrival at the servicer): ``vllm:time_to_first_token_seconds`` at the first
message with tokens, ``vllm:inter_token_latency_seconds`` per later token (a message of k tokens k times its
gap / k), ``vllm:e2e_request_latency_seconds`` for every call counted in request_success (aborts included).
The names are vLLM's, so dashboards work; the gateway serves them on its /metrics with its model_name label
(``GetLoad`` with ``request_metrics``). A readiness probe's call (``GenerateRequest.health_probe``, the gateway's
/health_generate) is not counted. The counts live in this process: they start from zero when the scheduler
restarts (Prometheus' ``rate()`` treats that as a counter reset).
"""

from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from codeserve.v1 import scheduler_pb2

LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
)


class RequestMetrics:
    """The request metrics of one scheduler (its own CollectorRegistry, so several can live in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token (seconds).",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between output tokens (seconds).",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "End-to-end latency of finished requests, aborted ones included (seconds).",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.success = Counter("vllm:request_success",
                               "Finished Generate calls by finish reason (abort: ended early, e.g. the client left).",
                               ["finished_reason"], registry=r)
        self.sibling_aborts = Counter("codeserve:sibling_aborts",
                                      "Calls counted in request_success{finished_reason=\"abort\"} that the gateway "
                                      "ended because another call of the same HTTP request failed (n > 1, a prompt "
                                      "list): not client aborts.", registry=r)
        self.errors = Counter("codeserve:generate_errors",
                              "Generate calls that ended with an error status, by gRPC status code.",
                              ["code"], registry=r)

    def call(self, health_probe: bool = False) -> "CallMetrics":
        """A new observer for one Generate call (its clock starts now); a health probe's
        (``GenerateRequest.health_probe``) observes nothing."""
        return CallMetrics(self, counted=not health_probe)

    def render(self) -> str:
        """The Prometheus text exposition of these metrics (no model_name label)."""
        return generate_latest(self.registry).decode()


class CallMetrics:
    """Observes one Generate call; the first of ``finished`` / ``failed`` / ``closed`` counts it, later ones do
    nothing. Used by the Generate handler of that call only (the guard makes a stray second thread harmless)."""

    def __init__(self, metrics: RequestMetrics, counted: bool = True) -> None:
        """``counted`` False: a call kept out of the metrics (a health probe): every method does nothing."""
        self._m = metrics
        self._start = time.perf_counter()
        self._last: float | None = None
        self._observes = counted
        self._counted = not counted
        self.sibling_abort = lambda: False  # set by the servicer: True when the call was aborted as a sibling
        self._lock = threading.Lock()

    def _claim(self) -> bool:
        with self._lock:
            if self._counted:
                return False
            self._counted = True
            return True

    def on_message(self, msg: scheduler_pb2.GenerateResponse) -> None:
        """Called for each message before it is sent: token latencies; the last message (finish_reason set)
        counts the call as finished with that reason."""
        count = len(msg.token_ids) if self._observes else 0
        if count > 0:
            now = time.perf_counter()
            if self._last is None:
                self._m.ttft.observe(now - self._start)
                count -= 1
            elif count:
                gap = (now - self._last) / count
                for _ in range(count):
                    self._m.itl.observe(gap)
            self._last = now
        if msg.finish_reason:
            self.finished(msg.finish_reason)

    def finished(self, reason: str) -> None:
        """Counts the call as finished with ``reason`` ("stop", "length", "abort") and observes its e2e latency."""
        if self._claim():
            self._m.success.labels(reason).inc()
            self._m.e2e.observe(time.perf_counter() - self._start)
            if reason == "abort" and self.sibling_abort():
                self._m.sibling_aborts.inc()

    def failed(self, code_name: str) -> None:
        """Counts the call as ended with the error status ``code_name`` (a grpc.StatusCode name)."""
        if self._claim():
            self._m.errors.labels(code_name).inc()

    def closed(self) -> None:
        """The call's handler ended: a call not counted yet (its generator closed before its last message)
        counts as finished with "abort"."""
        self.finished("abort")
