"""lessons.md section 1 failure shapes, each as a test that fails if the shape comes back.

Each test names the production symptom. Where our code cannot reach the faulty state by itself, the test
plants the fault in a real pool and shows the check that guards against it goes red.
"""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

import cache_svc
from cache_svc import integrity
from cache_svc.errors import ResourceExhausted
from cache_svc.items import CacheItem, MatchItem, Member
from cache_svc.pool import Pool
from cache_svc.radix_tree import TreeNode

S = "s"


def pool_with(capacity: int, page_size: int = 1) -> Pool:
    return Pool("p", page_size, [Member("w", "e", capacity)])


def cached(pool: Pool, rid: str, tokens: list[int]) -> None:
    """A finished request whose tokens end up evictable in the tree."""
    m = pool.match(S, [MatchItem(rid, "", tuple(tokens), True)])[0]
    pool.allocate(S, [(rid, len(tokens) - m.cached_tokens)])
    pool.cache(S, [CacheItem(rid, tuple(tokens), True)])


def register(pool: Pool, rid: str, tokens: list[int] = (), cap: int = 0) -> None:
    pool.match(S, [MatchItem(rid, "", tuple(tokens), True, cap)])


# ---- 1. the receipt was thrown away ---------------------------------------------------------------
def test_allocation_decides_on_what_eviction_freed_not_on_what_it_asked() -> None:
    """Symptom: 'Try to allocate 512 tokens. Available: 66039 (available=273 + evictable=65766)' after an
    eviction that freed less than asked. Here eviction can free 2 of the 6 it is asked for (4 are locked
    by a running request); the allocation must fail with a typed shortfall that says so, not crash."""
    pool = pool_with(8)
    cached(pool, "old", [1, 2, 3, 4, 5, 6])
    register(pool, "running", [1, 2, 3, 4, 9], cap=4)            # locks [1,2,3,4]; [5,6] stay evictable
    register(pool, "new")
    assert pool.counters().evictable == 2
    with pytest.raises(ResourceExhausted) as exc:
        pool.allocate(S, [("new", 7)])
    s = exc.value.shortfall
    assert (s.asked_tokens, s.freed_by_eviction, s.available, s.still_evictable) == (7, 2, 4, 0)
    assert "protected by locks (4)" in s.reason
    assert integrity.check(pool) == [] and pool.requests[(S, "new")].length == 0


def test_evict_receipt_counts_what_became_allocatable_when_asked_for_more_than_exists() -> None:
    pool = pool_with(8)
    cached(pool, "a", [1, 2, 3])
    receipt = pool.evict(100)
    assert (receipt.asked_tokens, receipt.freed_tokens) == (100, 3)
    assert receipt.after.available - receipt.before.available == receipt.freed_tokens == 3


# ---- 2. the selector and the consumer disagreed (tombstone leaves) -------------------------------
def test_no_operation_leaves_a_tombstone_and_evictable_equals_evict_infinity() -> None:
    pool = pool_with(32, page_size=4)
    cached(pool, "a", list(range(8)))
    cached(pool, "dup", list(range(8)))                          # duplicate insert: nothing new
    register(pool, "short", [0, 1, 2])                           # less than a page
    pool.allocate(S, [("short", 3)])
    pool.cache(S, [CacheItem("short", (0, 1, 2), True)])         # caches 0 whole pages: no empty node
    register(pool, "edge", list(range(4)) + [50, 51, 52, 53], cap=4)   # split exactly at a page boundary
    pool.release(S, ["edge"])
    assert all(node.value for node in pool.tree.nodes())
    evictable = pool.counters().evictable
    trial = pool.clone()
    assert trial.evict(float("inf")).freed_tokens == evictable == 8
    assert integrity.check(pool) == []


def test_integrity_catches_a_counted_node_that_eviction_cannot_consume() -> None:
    """Plant the disagreement: an unlocked node under which a locked child hangs (so it is never a leaf)
    and an empty tombstone leaf. The counter counts the first; evict(inf) cannot free it."""
    pool = pool_with(16)
    cached(pool, "a", [1, 2, 3, 4])
    register(pool, "r", [1, 2, 3, 4], cap=4)
    node = pool.requests[(S, "r")].node
    pool.tree.match("", [1, 2])                                   # split: upper [1,2], lower [3,4]
    upper = node.parent
    upper.lock_ref = 0                                            # the planted fault
    pool.tree.evictable_size += 2
    pool.tree.protected_size -= 2
    tomb = TreeNode(999, "", [], [], upper)
    upper.children[()] = tomb
    violations = integrity.check(pool)
    assert any("tombstone" in v for v in violations)
    assert any("evictable reports 2 but evict(inf) released 0" in v for v in violations)
    assert any("lock_ref(parent" in v for v in violations)


# ---- 4. relief wired into one allocation path only ------------------------------------------------
@pytest.mark.parametrize(
    "page_size, prefill, ask",
    [(1, 0, [5]), (1, 1, [1, 1, 1]), (4, 0, [6]), (4, 4, [1, 1])],
    ids=["extend", "decode-batch", "paged-extend", "paged-decode-at-boundary"],
)
def test_every_allocation_path_runs_the_relief_ladder(page_size: int, prefill: int, ask: list[int]) -> None:
    """Each path needs the ladder's rung: an eviction (a page freed just before does not suffice)."""
    p = page_size
    pool = pool_with(8 * p, page_size=p)
    rids = [f"r{i}" for i in range(len(ask))]
    for rid in rids:
        register(pool, rid)
        if prefill:
            pool.allocate(S, [(rid, prefill)])
    need_pages = sum(pool.pages_needed(pool.requests[(S, rid)], n) for rid, n in zip(rids, ask))
    register(pool, "stage")
    pool.allocate(S, [("stage", p)])
    cached(pool, "cold", list(range(p * (pool.allocator.free_pages - need_pages + 2))))
    pool.release(S, ["stage"])                                    # one page freed
    assert pool.allocator.free_pages < need_pages
    results, relief = pool.allocate(S, list(zip(rids, ask)))
    assert [len(r.slot_ids) for r in results] == ask
    assert relief is not None and relief.nodes_evicted >= 1
    assert integrity.check(pool) == []


def test_there_is_one_allocation_routine() -> None:
    """Only Pool.allocate takes pages from the allocator."""
    root = pathlib.Path(cache_svc.__file__).parent
    callers = [p.name for p in root.glob("*.py") for line in p.read_text().splitlines()
               if "allocator.allocate(" in line]
    assert callers == ["pool.py"]
