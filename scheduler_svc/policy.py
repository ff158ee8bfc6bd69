"""Which waiting request goes first (fcfs, lpm) and which running request a decode out-of-memory retracts."""

from __future__ import annotations

from typing import Callable, Sequence

from scheduler_svc.request import Req

POLICIES = ("fcfs", "lpm")
# Longest-prefix-match ordering looks at most this many waiting requests per round (SGLang does the same).
LPM_WINDOW = 128


def order_waiting(waiting: Sequence[Req], policy: str, prefix_lengths: Callable[[list[Req]], list[int]]) -> list[Req]:
    """The admission order of ``waiting``.

    fcfs: queue order (requeued requests were put at the front). lpm: requests with a longer cached
    prefix first (``prefix_lengths`` answers a non-locking match for a list of requests, in tokens), ties
    in queue order; only the first LPM_WINDOW are reordered, the rest follow in queue order. Requeued
    requests (retracted before) stay first under both policies: they already waited.
    Raises ValueError for an unknown policy.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {POLICIES}")
    reqs = list(waiting)
    if policy == "fcfs" or len(reqs) < 2:
        return reqs
    retried = [r for r in reqs if r.retractions > 0]
    fresh = [r for r in reqs if r.retractions == 0]
    window, rest = fresh[:LPM_WINDOW], fresh[LPM_WINDOW:]
    lengths = prefix_lengths(window)
    if len(lengths) != len(window):
        raise ValueError(f"prefix_lengths answered {len(lengths)} lengths for {len(window)} requests")
    ranked = sorted(range(len(window)), key=lambda i: (-lengths[i], i))
    return retried + [window[i] for i in ranked] + rest


def retract_victim(decoding: Sequence[Req]) -> Req:
    """The running request whose retract loses least: fewest generated tokens, then the most recently
    admitted (its recompute is cheapest and it waited least). Raises ValueError when there is none."""
    if not decoding:
        raise ValueError("no running request to retract")
    return min(decoding, key=lambda r: (len(r.output_ids), -r.admission))
