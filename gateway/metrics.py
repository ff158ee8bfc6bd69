"""Prometheus metrics with vLLM's names (prefix ``vllm:``) so existing dashboards work.

Latency histograms and the success counter are observed here, per request. Queue gauges, KV cache
usage and the prefix-cache / token counters are the scheduler's numbers (GetLoad), read at scrape
time. When GetLoad fails, those families are left out and ``codeserve:scheduler_up`` is 0: a scrape
never reports an invented value.
"""

from __future__ import annotations

import time
from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from codeserve.v1 import scheduler_pb2

_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
)


class _LoadCollector:
    """Exposes the last GetLoad reply (set just before each scrape) as gauges and counters."""

    def __init__(self, model_name: str) -> None:
        self._model_name = model_name
        self.load: scheduler_pb2.GetLoadResponse | None = None

    def collect(self) -> Iterable[Metric]:
        labels = ["model_name"]
        up = GaugeMetricFamily("codeserve:scheduler_up", "1 when the scheduler answered GetLoad at this scrape.",
                               labels=labels)
        up.add_metric([self._model_name], 0.0 if self.load is None else 1.0)
        yield up
        load = self.load
        if load is None:
            return

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric([self._model_name], value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric([self._model_name], value)
            return family

        yield gauge("vllm:num_requests_running", "Requests in the running batch.", load.running)
        yield gauge("vllm:num_requests_waiting", "Requests in the waiting queue.", load.waiting)
        capacity = sum(pool.capacity for pool in load.pools)
        available = sum(pool.available for pool in load.pools)
        evictable = sum(pool.evictable for pool in load.pools)
        # Used = held by requests or by the prefix cache and not reclaimable right now.
        usage = (capacity - available - evictable) / capacity if capacity > 0 else 0.0
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full (locked or in use, not evictable).",
                    usage)
        yield counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      load.prefix_query_tokens)
        yield counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", load.prefix_hit_tokens)
        yield counter("vllm:prompt_tokens", "Prefill tokens processed.", load.prompt_tokens_total)
        yield counter("vllm:generation_tokens", "Generated tokens.", load.generation_tokens_total)


class GatewayMetrics:
    """Owns one CollectorRegistry (so several apps can live in one process, e.g. in tests)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self._load = _LoadCollector(model_name)
        self.registry.register(self._load)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token (seconds).",
                              ["model_name"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between output tokens (seconds).",
                             ["model_name"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency (seconds).",
                             ["model_name"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.success = Counter("vllm:request_success", "Finished requests by finish reason.",
                               ["model_name", "finished_reason"], registry=self.registry)
        self.errors = Counter("codeserve:request_errors",
                              "Requests answered with an error status (HTTP status, error type); 499 = the client "
                              "went away first. Errors inside an already streaming 200 response are not counted.",
                              ["model_name", "status", "type"], registry=self.registry)

    def count_error(self, status: int, err_type: str) -> None:
        """Counts one error answer (status: HTTP status code; err_type: the body's ``error.type``)."""
        self.errors.labels(self.model_name, str(status), err_type).inc()

    def observer(self) -> "RequestObserver":
        """A new observer for one Generate call."""
        return RequestObserver(self)

    def render(self, load: scheduler_pb2.GetLoadResponse | None) -> bytes:
        """The Prometheus text exposition, with ``load`` (None when GetLoad failed) as the scheduler's numbers."""
        self._load.load = load
        return generate_latest(self.registry)


class RequestObserver:
    """Times one Generate call: TTFT at the first token, ITL per later token, e2e at the end."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics
        self._start = time.perf_counter()
        self._last: float | None = None

    def on_tokens(self, count: int) -> None:
        """Called when a message with ``count`` new tokens arrives."""
        if count <= 0:
            return
        now = time.perf_counter()
        labels = self._metrics.model_name
        if self._last is None:
            self._metrics.ttft.labels(labels).observe(now - self._start)
            count -= 1
        else:
            gap = (now - self._last) / count
            for _ in range(count):
                self._metrics.itl.labels(labels).observe(gap)
        self._last = now

    def on_finish(self, finish_reason: str) -> None:
        """Called once with the scheduler's finish reason."""
        labels = self._metrics.model_name
        self._metrics.e2e.labels(labels).observe(time.perf_counter() - self._start)
        self._metrics.success.labels(labels, finish_reason).inc()
