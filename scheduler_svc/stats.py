"""The loop's counters, in one object: batches, tokens, prefix hits, retractions, and the decode timing that
bench/ reads from the ``loop_stats`` log line (cumulative since start).

Decode rounds, cumulative seconds: ``decode_wall_seconds`` the loop's time in decode rounds;
``decode_alloc_seconds`` Cache.Allocate of decode batches; ``decode_rpc_seconds`` sending the Forward and
waiting for its reply (with overlap: only the wait left after the loop's own work);
``decode_process_seconds`` applying the results; ``decode_forward_seconds`` the worker's own forward time.
Counts: ``decode_chained`` Forwards sent before the previous reply was processed; ``decode_dropped`` results
of requests that had finished in the previous Forward (sent ahead for them, then dropped); ``extends_ahead``
extends of requests that arrived while a decode Forward ran, sent to run right after it; ``chunks_ahead``
extends sent behind an extend in flight whose prefill continues (chunked prefill pipelined, ``chunk_ahead.py``);
``prompts_cached_at_prefill`` running requests whose written prompt was inserted in the tree when their prefill
completed (``RequestTable.cache_prefilled``).
"""

from __future__ import annotations

import time

from scheduler_svc.batch import Batch


class Stats:
    """Counters of one scheduler (loop thread writes; ``counts`` is read by other threads as a plain dict).
    ``last_batch_at``: ``time.monotonic()`` of the last applied Forward reply (progress health)."""

    def __init__(self) -> None:
        self.counts = dict(batches=0, prefix_query=0, prefix_hit=0, prompt_tokens=0, generation_tokens=0,
                           retractions=0, decode_batches=0, decode_steps=0, decode_wall_seconds=0.0,
                           decode_forward_seconds=0.0, decode_alloc_seconds=0.0, decode_rpc_seconds=0.0,
                           decode_process_seconds=0.0, decode_chained=0, decode_dropped=0, extends_ahead=0,
                           chunks_ahead=0, prompts_cached_at_prefill=0, admissions_allocated_by_match=0)
        self.last_batch_at = time.monotonic()
        self._last_alloc_s = 0.0

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
