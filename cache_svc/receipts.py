"""Frozen result types: Counters, Receipt, EvictionReceipt, AllocationShortfall. All sizes are tokens (slots)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Counters:
    """Counters of one pool, in tokens.

    Invariant: ``available + cached + owned == capacity`` and ``cached == evictable + protected``.
    ``evictable`` is exactly what ``evict(infinity)`` would make allocatable now. ``fundable`` is what the
    allocation routine can pay after its relief ladder.
    """

    capacity: int
    available: int
    evictable: int
    protected: int
    owned: int

    @property
    def cached(self) -> int:
        """Slots held by the tree (evictable + protected)."""
        return self.evictable + self.protected

    @property
    def fundable(self) -> int:
        """available + evictable: the admission budget of the pool."""
        return self.available + self.evictable


@dataclass(frozen=True)
class EvictionReceipt:
    """What one eviction did. ``freed_tokens`` counts slots that became allocatable (measured on the
    allocator, not on what the tree let go of)."""

    asked_tokens: int
    freed_tokens: int
    nodes_evicted: int
    before: Counters
    after: Counters


@dataclass(frozen=True)
class Receipt:
    """What one mutating operation asked for and delivered, with the pool counters before and after."""

    pool_id: str
    op_id: str
    operation: str
    asked_tokens: int
    delivered_tokens: int
    before: Counters
    after: Counters
    replayed: bool = False


@dataclass(frozen=True)
class AllocationShortfall:
    """Why an allocation failed after the relief ladder.

    asked_tokens: slots the allocation needed (page-rounded for page_size > 1);
    freed_by_eviction: slots eviction made allocatable; still_evictable: what the tree still reports evictable; available: allocatable now;
    reason: a sentence saying why those numbers differ.
    """

    pool_id: str
    asked_tokens: int
    freed_by_eviction: int
    still_evictable: int
    available: int
    reason: str
    counters: Counters
