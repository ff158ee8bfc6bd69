"""The router's pending entries: requests routed to a replica but not yet prefilled there.

Between the routing decision and the scheduler writing a prompt's prefill into its pool's radix tree (which is
when the cache service's ``ProbePrefix`` starts to see it) the cache knows nothing of the request. Without a
record of it, a burst of prompts sharing one prefix would each probe 0 cached tokens everywhere and spread over
the replicas, each replica prefilling the same prefix. A pending entry holds the prompt's token ids on its replica
for a short time (``ttl_s``, or until the request's first message, when its prefill is written), and a new prompt's
longest common prefix with the pending prompts of a replica (whole pages) is routed as if it were cached there.

The table also counts the gateway's own calls per replica, exactly (``in_flight``, ``unstarted_tokens``: placed
and not ended, whatever their age; no TTL): every call carries the gateway's router id, and a replica's GetLoad
answers the others' load apart (``GetLoadResponse.others``), so the router adds the two and no poll can race one
of its calls. (Counting its calls from the poll did, both ways: a call routed just before a poll and seen by the
scheduler after it was in neither the poll nor the calls sent since, a burst split 12 / 20; one routed just after a
poll and seen by it was counted twice, then not subtracted when it ended, and a cached prompt sent again went to
the other replica by a cost of 617 against 600.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class PendingEntry:
    """One routed, not yet prefilled request. ``replica``: its index in the replica set; ``ids``: its prompt token
    ids (namespace-salted caches never share: ``namespace`` is part of the match); ``created_at``: monotonic
    seconds."""

    key: str  # the call's key: unique per routed call (a client may reuse a request id)
    replica: int
    namespace: str
    ids: tuple[int, ...]
    created_at: float


@dataclass
class OwnCall:
    """One of the gateway's calls, placed and not ended: its ``replica``, the prefill the router predicted it
    costs there (``uncached_tokens``), and whether its first message came (``started``: that prefill is done)."""

    replica: int
    uncached_tokens: int
    started: bool = False


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token id sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PendingTable:
    """Entries by request id, expired after ``ttl_s`` seconds (``clock``: monotonic seconds, settable for tests).
    An entry is pending until its request's first message (``started``), its call's end (``end``) or its TTL; the
    call counts (``in_flight``) from ``add`` to ``end``."""

    def __init__(self, ttl_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s <= 0:
            raise ValueError(f"pending ttl must be > 0 seconds (got {ttl_s})")
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[str, PendingEntry] = {}
        self._calls: dict[str, OwnCall] = {}  # every call placed and not ended, by key (no TTL)

    def add(self, key: str, replica: int, namespace: str, ids: Sequence[int], uncached_tokens: int) -> None:
        """Records a routed call by its ``key`` (unique per call; a retry on another replica replaces its entry)."""
        self._entries[key] = PendingEntry(key, replica, namespace, tuple(ids), self._clock())
        self._calls[key] = OwnCall(replica, uncached_tokens)

    def started(self, key: str) -> None:
        """The request's first message came: its prefill is in the pool's tree (the cache's probe sees it), so it
        is no longer pending; its call still counts until it ends."""
        self._entries.pop(key, None)
        call = self._calls.get(key)
        if call is not None:
            call.started = True

    def end(self, key: str) -> None:
        """The call ended (finished or failed): drops its entry and its count."""
        self._entries.pop(key, None)
        self._calls.pop(key, None)

    def in_flight(self, replica: int) -> int:
        """This gateway's calls on ``replica`` that were placed and have not ended (exact: no TTL)."""
        return sum(1 for c in self._calls.values() if c.replica == replica)

    def unstarted_tokens(self, replica: int) -> int:
        """The predicted uncached tokens of this gateway's calls on ``replica`` that have no first message yet
        (their prefill is queued or running there)."""
        return sum(c.uncached_tokens for c in self._calls.values() if c.replica == replica and not c.started)

    def entries(self) -> list[PendingEntry]:
        """The live entries (expired ones are dropped first), oldest first."""
        now = self._clock()
        for rid in [rid for rid, e in self._entries.items() if now - e.created_at >= self.ttl_s]:
            del self._entries[rid]
        return list(self._entries.values())

    def matched_tokens(self, namespace: str, ids: Sequence[int], replica: int, page_size: int) -> int:
        """The longest common prefix of ``ids`` with a pending prompt of ``replica`` in ``namespace``, in whole
        pages of ``page_size`` tokens (the radix tree caches whole pages), at most ``len(ids) - 1`` rounded down
        to a page (the last prompt token is always computed, as the scheduler's match does)."""
        best = 0
        for entry in self.entries():
            if entry.replica == replica and entry.namespace == namespace:
                best = max(best, common_prefix(entry.ids, ids))
        limit = max(0, len(ids) - 1)
        best = min(best, limit)
        return best - best % max(1, page_size)
