"""/metrics with several replicas: the vLLM names dashboards expect stay totals over the replicas, and each
replica's own numbers are served under ``codeserve:replica_*`` names with a ``replica`` label (kept apart from the
totals so that a ``sum()`` over a family never counts a replica twice).

Totals cover the replicas that answered GetLoad at this scrape (``codeserve:scheduler_up{replica}`` says which; a
replica that did not answer is left out of them, never counted as 0): the queue gauges and token counters summed,
``vllm:kv_cache_usage_perc`` over the pools of the replicas that read theirs, and the request metrics (TTFT, ITL,
e2e latency histograms, finished and failed calls) merged sample by sample (every scheduler uses the same buckets).
"""

from __future__ import annotations

from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from codeserve.v1 import scheduler_pb2

LoadOf = tuple[str, scheduler_pb2.GetLoadResponse | None]  # (replica name, its GetLoad or None when it failed)


def _usage(pools) -> float:
    capacity = sum(p.capacity for p in pools)
    used = capacity - sum(p.available for p in pools) - sum(p.evictable for p in pools)
    return used / capacity if capacity > 0 else 0.0


class ReplicaLoadCollector:
    """Exposes ``loads`` (set just before each scrape; None: not a multi-replica gateway, nothing is yielded)."""

    def __init__(self, model_name: str) -> None:
        self._model = model_name
        self.loads: list[LoadOf] | None = None

    def collect(self) -> Iterable[Metric]:
        if self.loads is None:
            return
        up = GaugeMetricFamily("codeserve:scheduler_up", "1 when the replica's scheduler answered GetLoad at this "
                               "scrape.", labels=["model_name", "replica"])
        for name, load in self.loads:
            up.add_metric([self._model, name], 0.0 if load is None else 1.0)
        yield up
        answered = [(name, load) for name, load in self.loads if load is not None]
        yield from self._totals([load for _, load in answered])
        yield from self._per_replica(answered)

    def _totals(self, loads: list[scheduler_pb2.GetLoadResponse]) -> Iterable[Metric]:
        def family(kind, name: str, doc: str, value: float):
            f = kind(name, doc, labels=["model_name"])
            f.add_metric([self._model], value)
            return f

        yield family(GaugeMetricFamily, "vllm:num_requests_running", "Requests in the running batches (all "
                     "replicas).", sum(ld.running for ld in loads))
        yield family(GaugeMetricFamily, "vllm:num_requests_waiting", "Requests in the waiting queues (all "
                     "replicas).", sum(ld.waiting for ld in loads))
        pools = [p for ld in loads if not ld.pool_error for p in ld.pools]
        if pools:
            yield family(GaugeMetricFamily, "vllm:kv_cache_usage_perc", "KV-cache usage over the pools read at "
                         "this scrape, 1 = full.", _usage(pools))
        for name, doc, attr in (
            ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix caches.", "prefix_query_tokens"),
            ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix caches.", "prefix_hit_tokens"),
            ("vllm:prompt_tokens", "Prefill tokens processed.", "prompt_tokens_total"),
            ("vllm:generation_tokens", "Generated tokens.", "generation_tokens_total"),
        ):
            yield family(CounterMetricFamily, name, doc, sum(getattr(ld, attr) for ld in loads))
        yield from self._merged_request_metrics([ld.request_metrics for ld in loads])

    def _merged_request_metrics(self, texts: list[str]) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        values: dict[str, dict[tuple, float]] = {}
        for text in texts:
            for fam in text_string_to_metric_families(text):
                if fam.name not in families:
                    families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                    values[fam.name] = {}
                for s in fam.samples:
                    if s.name.endswith("_created"):  # a creation time: summing it means nothing
                        continue
                    key = (s.name, tuple(sorted({**s.labels, "model_name": self._model}.items())))
                    values[fam.name][key] = values[fam.name].get(key, 0.0) + s.value
        for name, metric in families.items():
            for (sample, labels), value in values[name].items():
                metric.add_sample(sample, dict(labels), value)
            yield metric

    def _per_replica(self, answered: list[tuple[str, scheduler_pb2.GetLoadResponse]]) -> Iterable[Metric]:
        labels = ["model_name", "replica"]
        running = GaugeMetricFamily("codeserve:replica_requests_running", "Requests in the replica's running "
                                    "batch.", labels=labels)
        waiting = GaugeMetricFamily("codeserve:replica_requests_waiting", "Requests in the replica's waiting "
                                    "queue.", labels=labels)
        pool_up = GaugeMetricFamily("codeserve:cache_pool_up", "1 when the replica's scheduler read its KV pool "
                                    "from the cache at this scrape.", labels=labels)
        usage = GaugeMetricFamily("codeserve:replica_kv_cache_usage_perc", "The replica's KV-cache usage, 1 = "
                                  "full.", labels=labels)
        queries = CounterMetricFamily("codeserve:replica_prefix_cache_queries", "Prompt tokens the replica looked "
                                      "up in its prefix cache.", labels=labels)
        hits = CounterMetricFamily("codeserve:replica_prefix_cache_hits", "Prompt tokens the replica found in its "
                                   "prefix cache.", labels=labels)
        for name, ld in answered:
            running.add_metric([self._model, name], ld.running)
            waiting.add_metric([self._model, name], ld.waiting)
            pool_up.add_metric([self._model, name], 0.0 if ld.pool_error else 1.0)
            if not ld.pool_error:
                usage.add_metric([self._model, name], _usage(ld.pools))
            queries.add_metric([self._model, name], ld.prefix_query_tokens)
            hits.add_metric([self._model, name], ld.prefix_hit_tokens)
        yield from (running, waiting, pool_up, usage, queries, hits)
