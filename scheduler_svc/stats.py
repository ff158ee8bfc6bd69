"""The loop's counters, in one object: batches, tokens, prefix hits, retractions, and the decode timing that
bench/ reads from the ``loop_stats`` log line (cumulative since start).

Decode rounds, cumulative seconds: ``decode_wall_seconds`` the loop's time in decode rounds;
``decode_alloc_seconds`` Cache.Allocate of decode batches; ``decode_rpc_seconds`` sending the Forward and
waiting for its reply (with overlap: only the wait left after the loop's own work);
``decode_process_seconds`` applying the results; ``decode_forward_seconds`` the worker's own forward time.
Counts: ``decode_chained`` Forwards sent before the previous reply was processed (``decode_after_extend`` of
them: chained behind an extend, ``chain.can_chain``; ``decode_past_extends`` of them: sent behind the last extend
admitted ahead of a decode whose reply was in, ``chain.chain_past``; ``decode_chained_ahead`` of them: N+2 sent
before N was applied, ``chain.chain_ahead``); ``decode_dropped`` results
of requests that had finished in the previous Forward (sent ahead for them, then dropped); ``extends_ahead``
extends of requests that arrived while a decode Forward ran, sent to run right after it; ``chunks_ahead``
extends sent behind an extend in flight whose prefill continues (chunked prefill pipelined, ``chunk_ahead.py``);
``decode_steps_cut`` decode Forwards planned with fewer steps than ``--decode-steps`` because arrivals came
(``step_budget.py``); ``prompts_cached_at_prefill`` running requests whose written prompt was inserted in the
tree when their prefill completed (``RequestTable.cache_prefilled``); ``admissions_allocated_by_match``
admissions whose first chunk their Match allocated (one cache round trip); ``admissions_early_matched``
admissions made on an early Match's receipt (``early_match.py``: sent by the Generate handler, not the loop).

Prometheus (``render_metrics``, served on the gateway's /metrics through GetLoad):
``codeserve:decode_forward_steps`` a histogram of the steps of each decode Forward planned (its longest entry),
``codeserve:decode_forwards_steps_cut`` the ``decode_steps_cut`` count.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

from scheduler_svc.batch import Batch

STEP_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)  # decode steps per Forward


class Stats:
    """Counters of one scheduler (loop thread writes; ``counts`` is read by other threads as a plain dict).
    ``last_batch_at``: ``time.monotonic()`` of the last applied Forward reply (progress health)."""

    def __init__(self) -> None:
        self.counts = dict(batches=0, prefix_query=0, prefix_hit=0, prompt_tokens=0, generation_tokens=0,
                           retractions=0, decode_batches=0, decode_steps=0, decode_wall_seconds=0.0,
                           decode_forward_seconds=0.0, decode_alloc_seconds=0.0, decode_rpc_seconds=0.0,
                           decode_process_seconds=0.0, decode_chained=0, decode_after_extend=0, decode_past_extends=0,
                           decode_chained_ahead=0, decode_dropped=0, extends_ahead=0,
                           chunks_ahead=0, decode_steps_cut=0, prompts_cached_at_prefill=0,
                           admissions_allocated_by_match=0, admissions_early_matched=0)
        self.last_batch_at = time.monotonic()
        self._last_alloc_s = 0.0
        self.registry = CollectorRegistry()
        self.forward_steps = Histogram("codeserve:decode_forward_steps", "Decode steps of each decode Forward "
                                       "planned (its longest entry); fewer than --decode-steps while arrivals come "
                                       "(adaptive steps) or near max_new_tokens.", buckets=STEP_BUCKETS,
                                       registry=self.registry)
        self.registry.register(_CountCollector(self.counts))

    def add(self, key: str, n: int = 1) -> None:
        """Adds ``n`` to counter ``key`` (KeyError for an unknown one)."""
        self.counts[key] += n

    def batch_applied(self) -> None:
        """A Forward's reply was applied: one more batch, and the loop made progress now."""
        self.counts["batches"] += 1
        self.last_batch_at = time.monotonic()

    def decode_allocated(self, seconds: float) -> None:
        """Cache.Allocate of a decode batch took ``seconds``."""
        self.counts["decode_alloc_seconds"] += seconds
        self._last_alloc_s = seconds

    def decode_planned(self, steps: int, cut: bool) -> None:
        """A decode Forward of up to ``steps`` steps was planned; ``cut``: arrivals made it fewer than the
        configured K (``step_budget.py``)."""
        self.forward_steps.observe(steps)
        self.counts["decode_steps_cut"] += int(cut)

    def render_metrics(self) -> str:
        """The Prometheus text exposition of the loop's metrics (no model_name label)."""
        return generate_latest(self.registry).decode()

    def decode_sent(self, wall: float) -> None:
        """An overlapped decode round that only planned and sent its Forward, in ``wall`` seconds: all but its
        allocation counts as rpc (the reply is waited for and processed in a later round)."""
        self.counts["decode_rpc_seconds"] += wall - self._last_alloc_s
        self.counts["decode_wall_seconds"] += wall

    def decode_applied(self, batch: Batch, forward_seconds: float, wall: float, rpc: float, process: float) -> None:
        """A decode Forward's reply was applied: ``wall`` seconds of the round, ``rpc`` of them waiting for the
        reply, ``process`` applying it; ``forward_seconds`` the worker's own."""
        c = self.counts
        c["decode_batches"] += 1
        c["decode_steps"] += max(e.steps for e in batch.entries)
        c["decode_wall_seconds"] += wall
        c["decode_forward_seconds"] += forward_seconds
        c["decode_rpc_seconds"] += rpc
        c["decode_process_seconds"] += process


class _CountCollector:
    """``decode_steps_cut`` of ``counts`` as a Prometheus counter (read at scrape time: the count lives in
    ``counts`` only)."""

    def __init__(self, counts: dict) -> None:
        self._counts = counts

    def collect(self):
        family = CounterMetricFamily("codeserve:decode_forwards_steps_cut", "Decode Forwards planned with fewer "
                                     "steps than --decode-steps because arrivals came (adaptive steps).")
        family.add_metric([], self._counts["decode_steps_cut"])
        yield family
