"""Prometheus metrics with vLLM's names (prefix ``vllm:``) so existing dashboards work.

Request metrics (TTFT, ITL, e2e latency, finished requests by finish reason, failed Generate calls by gRPC
status) are kept by the scheduler, where every request passes, HTTP and gRPC alike
(``scheduler_svc/request_metrics.py``); queue gauges, KV cache usage and the prefix-cache / token counters are
the scheduler's numbers too. All of them are read with GetLoad at scrape time and served here with this
gateway's model_name label. The gateway itself counts only the error answers that no Generate call carries
(``codeserve:request_errors``). When GetLoad fails, the scheduler's families are left out and
``codeserve:scheduler_up`` is 0 (it means only that the scheduler did not answer); when the scheduler answered but
could not read its pool from the cache (``GetLoadResponse.pool_error``), only ``vllm:kv_cache_usage_perc`` is left
out and ``codeserve:cache_pool_up`` is 0, the request metrics and counters stand: a scrape never reports an
invented value.
"""

from __future__ import annotations

import os
from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from codeserve.v1 import scheduler_pb2
from gateway.replica_metrics import LoadOf, ReplicaLoadCollector
from gateway.workers import MULTIPROC_ENV


class _LoadCollector:
    """Exposes the last GetLoad reply (set just before each scrape) as gauges and counters."""

    def __init__(self, model_name: str) -> None:
        self._model_name = model_name
        self.load: scheduler_pb2.GetLoadResponse | None = None
        self.enabled = True  # False on a gateway of several replicas (gateway.replica_metrics serves them)

    def collect(self) -> Iterable[Metric]:
        if not self.enabled:
            return
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
        yield gauge("codeserve:cache_pool_up", "1 when the scheduler read its KV pool's counters from the cache at "
                    "this scrape (0: the cache did not answer; kv_cache_usage_perc is left out).",
                    0.0 if load.pool_error else 1.0)
        if not load.pool_error:
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
        yield from self._request_metrics(load.request_metrics)

    def _request_metrics(self, text: str) -> Iterable[Metric]:
        """The scheduler's request metrics (Prometheus text, scheduler_svc/request_metrics.py) with this
        gateway's model_name label added to every sample."""
        for family in text_string_to_metric_families(text):
            metric = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                metric.add_sample(sample.name, {**sample.labels, "model_name": self._model_name}, sample.value,
                                  sample.timestamp, sample.exemplar)
            yield metric


class GatewayMetrics:
    """Owns one CollectorRegistry (so several apps can live in one process, e.g. in tests). In a gateway of several
    processes (``gateway/workers.py``: ``PROMETHEUS_MULTIPROC_DIR`` set) ``codeserve:request_errors`` is kept in
    prometheus-client's multiprocess files and read back summed over every process."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self._load = _LoadCollector(model_name)
        self.registry.register(self._load)
        self._replica_loads = ReplicaLoadCollector(model_name)
        self.registry.register(self._replica_loads)
        shared = bool(os.environ.get(MULTIPROC_ENV))  # several gateway processes
        self.errors = Counter("codeserve:request_errors",
                              "HTTP requests the gateway answered with an error that no Generate call counts at "
                              "the scheduler (refused before any call: bad input, unknown model or path, the "
                              "scheduler known down or unreachable; gateway faults), by HTTP status and error type.",
                              ["model_name", "status", "type"], registry=None if shared else self.registry)
        if shared:
            multiprocess.MultiProcessCollector(self.registry)

    def count_error(self, status: int, err_type: str) -> None:
        """Counts one error answer (status: HTTP status code; err_type: the body's ``error.type``)."""
        self.errors.labels(self.model_name, str(status), err_type).inc()

    def render(self, load: scheduler_pb2.GetLoadResponse | None) -> bytes:
        """The Prometheus text exposition, with ``load`` (None when GetLoad failed; asked with request_metrics)
        as the scheduler's numbers."""
        self._load.load = load
        return generate_latest(self.registry)

    def render_replicas(self, loads: list[LoadOf]) -> bytes:
        """The exposition of a gateway of several replicas: ``loads`` (replica name, its GetLoad asked with
        request_metrics, or None when it failed) as totals and per-replica families (gateway.replica_metrics)."""
        self._load.enabled = False
        self._replica_loads.loads = loads
        return generate_latest(self.registry)
