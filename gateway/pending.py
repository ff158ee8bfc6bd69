"""The router's pending entries: requests routed to a replica but not yet prefilled there.

Between the routing decision and the scheduler writing a prompt's prefill into its pool's radix tree (which is
when the cache service's ``ProbePrefix`` starts to see it) the cache knows nothing of the request. Without a
record of it, a burst of prompts sharing one prefix would each probe 0 cached tokens everywhere and spread over
the replicas, each replica prefilling the same prefix. A pending entry holds the prompt's token ids on its replica
for a short time (``ttl_s``, or until the request's first message, when its prefill is written), and a new prompt's
longest common prefix with the pending prompts of a replica (whole pages) is routed as if it were cached there.

The same entries are the gateway's own count of the calls it sent since a replica's last load poll was sent (the
ones that poll cannot have seen): ``fresh``. An entry stays until its call ends (``end``) or its TTL, so a call
that started (``started``: its first message came; it is no longer pending for prefix matching, its prefill no
longer queued) still counts as a request on its replica until a poll sees it. Without that, a replica whose first
messages come sooner would look emptier than it is between two polls and draw more of a burst.

The other way round, a call that was in a poll's numbers and ended after that poll was asked (``end``) is
subtracted from them (``ended_since``): right after a burst the last poll still counts its finished calls as
running, and a replica that just finished its share would look busier than one that did not (seen end to end: a
second send of a cached prompt routed away from its holder by a cost of 665 against 664).

A poll can also miss calls: one routed before the poll was asked whose Generate reached the scheduler after the
poll was answered is neither in the poll nor fresh. The table's exact count of this gateway's own calls per replica
(``in_flight``, ``unstarted_tokens``: routed and not ended, whatever their age) is the floor of the load the router
uses, so such a call is never routed as if it were not there (seen end to end: a burst of 32 distinct prompts
split 12 / 20 on a slow machine).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence


_ENDED_KEPT_S = 10.0  # ended calls remembered this long: far past a load poll's period


@dataclass(frozen=True)
class PendingEntry:
    """One routed, not yet prefilled request. ``replica``: its index in the replica set; ``ids``: its prompt token
    ids (namespace-salted caches never share: ``namespace`` is part of the match); ``uncached_tokens``: the prefill
    the router predicted it costs there (prompt tokens - predicted cached); ``created_at``: monotonic seconds;
    ``started``: its first message came."""

    request_id: str
    replica: int
    namespace: str
    ids: tuple[int, ...]
    uncached_tokens: int
    created_at: float
    started: bool = False  # its first message came: its prefill is written (the cache's probe sees it)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token id sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PendingTable:
    """Entries by request id, expired after ``ttl_s`` seconds (``clock``: monotonic seconds, settable for tests).
    An entry is pending until its request's first message (``started``); it leaves when its call ends or fails
    (``end``) or at its TTL."""

    def __init__(self, ttl_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s <= 0:
            raise ValueError(f"pending ttl must be > 0 seconds (got {ttl_s})")
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[str, PendingEntry] = {}
        self._ended: deque[tuple[int, float, float]] = deque()  # (replica, routed at, ended at), oldest first
        self._routed: dict[str, int] = {}  # request id -> replica, for every call placed and not ended (no TTL)

    def add(self, request_id: str, replica: int, namespace: str, ids: Sequence[int], uncached_tokens: int) -> None:
        """Records a routed request (replacing an entry of the same id: a retry on another replica)."""
        self._entries[request_id] = PendingEntry(request_id, replica, namespace, tuple(ids), uncached_tokens,
                                                 self._clock())
        self._routed[request_id] = replica

    def started(self, request_id: str) -> None:
        """The request's first message came: no longer pending (no-op when it expired)."""
        entry = self._entries.get(request_id)
        if entry is not None:
            self._entries[request_id] = dataclasses.replace(entry, started=True)

    def end(self, request_id: str, replica: int) -> None:
        """The request's call on ``replica`` ended (finished or failed): drops its entry and records the end for
        ``ended_since``. A call whose entry already expired was routed more than ``ttl_s`` ago."""
        entry = self._entries.pop(request_id, None)
        self._routed.pop(request_id, None)
        now = self._clock()
        routed_at = entry.created_at if entry is not None and entry.replica == replica else now - self.ttl_s
        while self._ended and now - self._ended[0][2] >= _ENDED_KEPT_S:
            self._ended.popleft()
        self._ended.append((replica, routed_at, now))

    def ended_since(self, replica: int, since: float) -> int:
        """Calls of ``replica`` routed before ``since`` (a load poll was asked then: they are in its numbers) that
        ended after it."""
        return sum(1 for r, routed, ended in self._ended if r == replica and routed < since <= ended)

    def in_flight(self, replica: int) -> int:
        """This gateway's calls on ``replica`` that were placed and have not ended (exact: no TTL)."""
        return sum(1 for r in self._routed.values() if r == replica)

    def unstarted_tokens(self, replica: int) -> int:
        """The predicted uncached tokens of ``replica``'s live entries that have no first message yet (their
        prefill is queued or running there)."""
        return sum(e.uncached_tokens for e in self.entries() if e.replica == replica and not e.started)

    def entries(self) -> list[PendingEntry]:
        """The live entries (expired ones are dropped first), oldest first."""
        now = self._clock()
        for rid in [rid for rid, e in self._entries.items() if now - e.created_at >= self.ttl_s]:
            del self._entries[rid]
        return list(self._entries.values())

    def matched_tokens(self, namespace: str, ids: Sequence[int], replica: int, page_size: int) -> int:
        """The longest common prefix of ``ids`` with a pending prompt of ``replica`` in ``namespace``, in whole
        pages of ``page_size`` tokens (started entries are not pending: the cache's probe sees them) (the radix tree caches whole pages), at most ``len(ids) - 1`` rounded down
        to a page (the last prompt token is always computed, as the scheduler's match does)."""
        best = 0
        for entry in self.entries():
            if entry.replica == replica and entry.namespace == namespace and not entry.started:
                best = max(best, common_prefix(entry.ids, ids))
        limit = max(0, len(ids) - 1)
        best = min(best, limit)
        return best - best % max(1, page_size)

    def fresh(self, replica: int, since: float) -> list[PendingEntry]:
        """The live entries of ``replica`` created at or after ``since`` (monotonic seconds: when the replica's
        last load poll was sent; entries older than that are in the polled load already), started or not."""
        return [e for e in self.entries() if e.replica == replica and e.created_at >= since]
