"""Pool unit tests: page-granular extend/decode, the relief ladder, cache/release ownership, group capacity."""

from __future__ import annotations

import pytest

from cache_svc import integrity
from cache_svc.errors import InvalidArgument, NotFound, ResourceExhausted
from cache_svc.items import CacheItem, MatchItem, Member
from cache_svc.pool import Pool

S = "session"


def make(capacity: int = 16, page_size: int = 1) -> Pool:
    return Pool("p", page_size, [Member("w0", "e1", capacity)])


def lock(pool: Pool, rid: str, tokens, cap: int = 0, ns: str = ""):
    return pool.match(S, [MatchItem(rid, ns, tuple(tokens), True, cap)])[0]


def finish(pool: Pool, rid: str, tokens) -> None:
    pool.cache(S, [CacheItem(rid, tuple(tokens), True)])


def run(pool: Pool, rid: str, tokens, cap: int = 0) -> list[int]:
    """Match+lock, allocate the rest, cache as finished; returns the request's full slot list."""
    m = lock(pool, rid, tokens, cap)
    (a,), _ = pool.allocate(S, [(rid, len(tokens) - m.cached_tokens)])
    finish(pool, rid, tokens)
    return list(m.slot_ids) + list(a.slot_ids)


def test_group_capacity_is_the_minimum_floored_to_pages() -> None:
    pool = Pool("p", 4, [Member("w0", "e", 100), Member("w1", "e", 70)])
    assert pool.capacity == 68 and pool.counters().available == 68


def test_paged_extend_fills_partial_last_page_then_new_pages() -> None:
    pool = make(capacity=32, page_size=4)
    lock(pool, "r", [])
    (a,), _ = pool.allocate(S, [("r", 3)])
    assert a.slot_ids == (4, 5, 6)                                  # page 1, the partial page has 1 slot left
    (b,), _ = pool.allocate(S, [("r", 6)])
    assert b.slot_ids == (7, 8, 9, 10, 11, 12, 13)[:6]              # fills slot 7, then page 2, then page 3
    assert pool.counters().owned == 12 and pool.counters().available == 20
    assert integrity.check(pool) == []


def test_paged_decode_moves_to_a_new_page_only_at_a_boundary() -> None:
    pool = make(capacity=32, page_size=4)
    lock(pool, "r", [])
    pool.allocate(S, [("r", 2)])
    owned = [pool.counters().owned]
    slots = []
    for _ in range(4):
        (d,), _ = pool.allocate(S, [("r", 1)])
        slots += d.slot_ids
        owned.append(pool.counters().owned)
    assert slots == [6, 7, 8, 9]
    assert owned == [4, 4, 4, 8, 8]                                # a new page only at position 4


def test_decode_batch_is_all_or_nothing() -> None:
    pool = make(capacity=4)
    for rid in "abc":
        lock(pool, rid, [])
    pool.allocate(S, [("a", 1), ("b", 1)])
    with pytest.raises(ResourceExhausted):
        pool.allocate(S, [("a", 1), ("b", 1), ("c", 1)])
    assert pool.counters().available == 2 and pool.requests[(S, "c")].length == 0
    with pytest.raises(NotFound):
        pool.allocate(S, [("zzz", 1)])
    with pytest.raises(InvalidArgument):
        pool.allocate(S, [("a", 1), ("a", 1)])


def test_cache_frees_duplicates_and_reports_already_cached() -> None:
    pool = make()
    first = run(pool, "a", [1, 2, 3, 4])
    lock(pool, "b", [1, 2, 3, 4], cap=1)                            # b sees only 1 cached token
    (b,), _ = pool.allocate(S, [("b", 3)])
    (res,) = pool.cache(S, [CacheItem("b", (1, 2, 3, 4), True)])
    assert (res.already_cached_tokens, res.inserted_tokens, res.freed_tokens) == (4, 0, 3)
    assert pool.tree.match("", [1, 2, 3, 4])[0] == first           # the old slots stay
    assert pool.counters().available == 12 and integrity.check(pool) == []


def test_unfinished_cache_moves_the_lock_onto_the_slots_it_wrote() -> None:
    pool = make()
    first = run(pool, "a", [1, 2, 3])
    lock(pool, "b", [1, 2, 9, 9], cap=2)
    (alloc,), _ = pool.allocate(S, [("b", 2)])                      # positions 2..3
    (res,) = pool.cache(S, [CacheItem("b", (1, 2, 9), False)])
    assert res.already_cached_tokens == 2 and res.inserted_tokens == 1 and res.freed_tokens == 0
    assert res.prefix_slot_ids == (first[0], first[1], alloc.slot_ids[0])  # the slots it reads already
    req = pool.requests[(S, "b")]
    assert req.prefix_len == 3 and req.length == 4 and len(req.pages) == 1   # position 3 still owned
    assert pool.counters().protected == 3 and pool.counters().owned == 1
    assert integrity.check(pool) == []
    pool.release(S, ["b"])
    assert pool.counters().protected == 0 and pool.counters().available == 16 - 4


def test_unfinished_cache_never_remaps_a_request_onto_another_copy() -> None:
    """b matched 1 token, then a inserted [1, 2, 3]: inserting b's written [1, 2] would free its own slot for
    position 1 and hand it a's (the worker's slot table for b would go stale). Nothing changes for b; at
    finish its duplicates are freed."""
    pool = make()
    lock(pool, "b", [1, 2, 3, 4], cap=1)
    run(pool, "x", [1])
    pool.release(S, ["b"])
    lock(pool, "b", [1, 2, 3, 4], cap=1)                            # b reads slot of [1] from the tree
    (alloc,), _ = pool.allocate(S, [("b", 3)])                      # b writes positions 1..3
    run(pool, "a", [1, 2, 3])                                        # a caches [1, 2, 3] on its own slots
    before = pool.counters()
    (res,) = pool.cache(S, [CacheItem("b", (1, 2, 3), False)])
    assert (res.already_cached_tokens, res.inserted_tokens, res.freed_tokens) == (3, 0, 0)
    req = pool.requests[(S, "b")]
    assert res.prefix_slot_ids == tuple(req.prefix_slots) and req.prefix_len == 1
    assert req.pages == list(alloc.slot_ids) and pool.counters() == before and integrity.check(pool) == []
    (done,) = pool.cache(S, [CacheItem("b", (1, 2, 3, 4), True)])
    assert (done.already_cached_tokens, done.inserted_tokens, done.freed_tokens) == (3, 1, 2)
    assert pool.counters().owned == 0 and integrity.check(pool) == []


def test_paged_unfinished_cache_keeps_partial_tail_page_owned() -> None:
    pool = make(capacity=32, page_size=4)
    lock(pool, "r", list(range(10)))
    pool.allocate(S, [("r", 10)])
    (res,) = pool.cache(S, [CacheItem("r", tuple(range(10)), False)])
    assert res.inserted_tokens == 8 and len(res.prefix_slot_ids) == 8
    req = pool.requests[(S, "r")]
    assert req.prefix_len == 8 and req.length == 10 and len(req.pages) == 1
    (d,), _ = pool.allocate(S, [("r", 2)])                          # fills the tail page, no new page
    assert len(req.pages) == 1 and d.slot_ids[0] % 4 == 2
    assert integrity.check(pool) == []


def test_release_frees_exactly_uncached_slots_and_unlocks() -> None:
    pool = make()
    run(pool, "a", [1, 2, 3, 4])
    lock(pool, "b", [1, 2, 3, 4, 5], cap=4)
    pool.allocate(S, [("b", 3)])
    before = pool.counters()
    assert (before.protected, before.owned) == (4, 3)
    assert pool.release(S, ["b"]) == 3
    after = pool.counters()
    assert (after.protected, after.evictable, after.owned, after.available) == (0, 4, 0, 12)


def test_cache_rejects_tokens_beyond_allocation_or_a_different_prefix_and_changes_nothing() -> None:
    pool = make()
    run(pool, "a", [1, 2, 3])
    lock(pool, "b", [1, 2, 3])
    pool.allocate(S, [("b", 1)])
    before = pool.counters()
    with pytest.raises(InvalidArgument, match="only 4 slots"):
        pool.cache(S, [CacheItem("b", (1, 2, 3, 4, 5), True)])
    with pytest.raises(InvalidArgument, match="matched prefix"):
        pool.cache(S, [CacheItem("b", (1, 2, 7, 4), True)])
    assert pool.counters() == before and integrity.check(pool) == []


def test_relief_ladder_evicts_what_is_short_and_counts_what_became_allocatable() -> None:
    pool = make(capacity=8)
    run(pool, "cached", [1, 2, 3, 4])                              # 4 evictable
    lock(pool, "x", [])
    pool.allocate(S, [("x", 2)])
    pool.release(S, ["x"])                                          # 2 freed
    lock(pool, "y", [])
    assert pool.counters().available == 4
    (a,), relief = pool.allocate(S, [("y", 7)])                     # 4 available + 3 of 4 evictable
    assert len(a.slot_ids) == 7
    assert relief is not None and relief.freed_tokens == 4 and relief.nodes_evicted == 1
    assert relief.asked_tokens == 3                                 # only what was short
    assert pool.counters().available == 1                           # cascade freed the whole node (4)
    assert integrity.check(pool) == []


def test_shortfall_names_asked_freed_and_why() -> None:
    pool = make(capacity=8)
    run(pool, "cached", [1, 2])
    lock(pool, "hold", [1, 2])                                      # protected 2
    lock(pool, "r", [])
    with pytest.raises(ResourceExhausted) as exc:
        pool.allocate(S, [("r", 7)])
    s = exc.value.shortfall
    assert (s.asked_tokens, s.freed_by_eviction, s.still_evictable, s.available) == (7, 0, 0, 6)
    assert "protected by locks (2)" in s.reason
    assert pool.requests[(S, "r")].length == 0
