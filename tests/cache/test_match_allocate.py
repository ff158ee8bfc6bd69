"""Admission in one round trip: a locking Match item with ``allocate_up_to`` also allocates its first chunk's slots
from free pages, with a receipt of its own; a release frees them (real server, generated stubs)."""

from __future__ import annotations

import grpc
import pytest

from cache_svc.sessions import OpLog
from codeserve.v1 import cache_pb2
from tests.cache.conftest import op, register
from tests.cache.test_service import P, allocate, cache, code_of, counters, match, release, session


def match_alloc(stub, sid, rid, tokens, up_to, compute=None, lock=True):
    return stub.Match(cache_pb2.MatchRequest(op_id=op(), session_id=sid, pool_id=P, items=[cache_pb2.MatchItem(
        request_id=rid, token_ids=tokens, lock=lock, max_match_tokens=max(len(tokens) - 1, 0),
        allocate_up_to=up_to, compute_tokens=len(tokens) if compute is None else compute)]))


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_match_allocates_the_rest_of_the_prompt_up_to_the_cap(stub, page_size) -> None:
    register(stub, capacity=64, page_size=page_size)
    sid = session(stub)
    match(stub, sid, "w", list(range(1, 9)))
    allocate(stub, sid, [("w", 8)])
    cache(stub, sid, "w", list(range(1, 9)))  # 8 tokens cached
    got = match_alloc(stub, sid, "a", list(range(1, 14)), up_to=100)  # 13 tokens, 8 cached
    res = got.results[0]
    assert res.cached_tokens == 8 and len(res.allocated_slot_ids) == 5
    assert not set(res.allocated_slot_ids) & set(res.slot_ids)
    assert got.allocation.operation == "allocate"
    assert (got.allocation.asked_tokens, got.allocation.delivered_tokens) == (5, 5)
    assert got.allocation.before == got.receipt.after  # the match's receipt is the locks alone
    assert got.allocation.after.owned - got.receipt.after.owned == -(-5 // page_size) * page_size
    capped = match_alloc(stub, sid, "b", list(range(1, 14)), up_to=3)
    assert len(capped.results[0].allocated_slot_ids) == 3
    before = counters(stub)
    release(stub, sid, ["a", "b"])
    assert counters(stub).available > before.available and counters(stub).owned == 0


def test_an_allocation_the_free_pages_cannot_pay_is_not_made_and_evicts_nothing(stub) -> None:
    register(stub, capacity=16)
    sid = session(stub)
    match(stub, sid, "w", list(range(1, 11)))
    allocate(stub, sid, [("w", 10)])
    cache(stub, sid, "w", list(range(1, 11)))  # 10 cached (evictable), 6 free
    got = match_alloc(stub, sid, "a", list(range(100, 108)), up_to=8)  # 8 new tokens > 6 free
    assert got.results[0].allocated_slot_ids == []
    assert (got.allocation.asked_tokens, got.allocation.delivered_tokens) == (8, 0)
    assert got.allocation.after == got.allocation.before and got.allocation.after.evictable == 10
    # the caller's Allocate may still evict for it
    allocate(stub, sid, [("a", 8)])


def test_without_allocate_up_to_there_is_no_allocation_receipt(stub) -> None:
    register(stub, capacity=16)
    sid = session(stub)
    got = match(stub, sid, "a", [1, 2, 3])
    assert not got.HasField("allocation") and got.results[0].allocated_slot_ids == []


def test_allocate_up_to_needs_a_lock_and_a_count_of_zero_or_more(stub) -> None:
    register(stub, capacity=16)
    sid = session(stub)
    code, details = code_of(lambda: match_alloc(stub, sid, "a", [1, 2, 3], up_to=2, lock=False))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "allocate_up_to" in details
    code, details = code_of(lambda: match_alloc(stub, sid, "b", [1, 2, 3], up_to=-1))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "allocate_up_to" in details
    assert counters(stub).owned == 0 and counters(stub).protected == 0  # nothing registered or locked


def test_a_negative_compute_tokens_is_invalid_and_changes_nothing(stub) -> None:
    register(stub, capacity=16)
    sid = session(stub)
    code, details = code_of(lambda: match_alloc(stub, sid, "a", [1, 2, 3], up_to=2, compute=-1))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "compute_tokens" in details
    assert counters(stub).owned == 0 and counters(stub).protected == 0  # nothing registered or allocated
    assert len(match_alloc(stub, sid, "a", [1, 2, 3], up_to=2).results[0].allocated_slot_ids) == 2  # "a" is free


def test_a_retried_match_replays_its_allocation_receipt_too(stub) -> None:
    register(stub, capacity=16)
    sid = session(stub)
    request = cache_pb2.MatchRequest(op_id=op(), session_id=sid, pool_id=P, items=[cache_pb2.MatchItem(
        request_id="a", token_ids=[1, 2, 3], lock=True, max_match_tokens=2, allocate_up_to=8, compute_tokens=3)])
    first, again = stub.Match(request), stub.Match(request)
    assert not first.allocation.replayed and not first.receipt.replayed
    assert again.receipt.replayed and again.allocation.replayed  # the stored answer, allocated once
    assert again.results[0].allocated_slot_ids == first.results[0].allocated_slot_ids
    assert counters(stub).owned == 3


def test_the_op_log_bound_counts_the_slots_a_match_allocated(stub, core) -> None:
    """A stored Match outcome holds its allocated slot ids: they count against the op log's bound on the slot ids
    it keeps (``OpLog.max_ints``), as Allocate's do, so the oldest goes once the bound is passed."""
    core.ops = OpLog(capacity=4096, max_ints=12)
    register(stub, capacity=32)
    sid = session(stub)
    first = cache_pb2.MatchRequest(op_id=op(), session_id=sid, pool_id=P, items=[cache_pb2.MatchItem(
        request_id="a", token_ids=[1, 2, 3], lock=True, max_match_tokens=2, allocate_up_to=8, compute_tokens=8)])
    assert len(stub.Match(first).results[0].allocated_slot_ids) == 8
    assert len(match_alloc(stub, sid, "b", [4, 5, 6], up_to=8, compute=8).results[0].allocated_slot_ids) == 8
    code, details = code_of(lambda: stub.Match(first))  # 16 slot ids > 12: the first was dropped, runs again
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "already registered" in details
