"""End-to-end slice through a real server: register, session, match+lock, allocate, cache, release."""

from __future__ import annotations

from codeserve.v1 import cache_pb2
from tests.cache.conftest import op, register


def test_request_life_register_match_allocate_cache_release(stub) -> None:
    reg = register(stub, capacity=32)
    assert reg.flushed and reg.capacity == 32 and reg.reserved_slot == 0
    sid = stub.OpenSession(cache_pb2.OpenSessionRequest(owner="scheduler-0")).session_id

    m = stub.Match(cache_pb2.MatchRequest(op_id=op(), session_id=sid, pool_id="p", items=[
        cache_pb2.MatchItem(request_id="a", token_ids=[5, 6, 7, 8], lock=True, max_match_tokens=3)]))
    assert m.results[0].cached_tokens == 0 and list(m.results[0].slot_ids) == []

    a = stub.Allocate(cache_pb2.AllocateRequest(op_id=op(), session_id=sid, pool_id="p", items=[
        cache_pb2.AllocItem(request_id="a", num_tokens=4)]))
    slots = list(a.results[0].slot_ids)
    assert len(slots) == 4 and 0 not in slots
    assert a.receipt.after.available == 28 and a.receipt.after.owned == 4

    c = stub.CacheRequests(cache_pb2.CacheRequestsRequest(op_id=op(), session_id=sid, pool_id="p", items=[
        cache_pb2.CacheItem(request_id="a", token_ids=[5, 6, 7, 8], finished=True)]))
    assert c.results[0].inserted_tokens == 4 and c.results[0].already_cached_tokens == 0
    assert c.receipt.after.evictable == 4 and c.receipt.after.owned == 0

    m2 = stub.Match(cache_pb2.MatchRequest(op_id=op(), session_id=sid, pool_id="p", items=[
        cache_pb2.MatchItem(request_id="b", token_ids=[5, 6, 7, 8], lock=True, max_match_tokens=3)]))
    assert m2.results[0].cached_tokens == 3 and list(m2.results[0].slot_ids) == slots[:3]
    assert m2.receipt.after.protected == 3 and m2.receipt.after.evictable == 1

    a2 = stub.Allocate(cache_pb2.AllocateRequest(op_id=op(), session_id=sid, pool_id="p", items=[
        cache_pb2.AllocItem(request_id="b", num_tokens=1)]))
    r = stub.ReleaseRequests(cache_pb2.ReleaseRequestsRequest(op_id=op(), session_id=sid, pool_id="p", request_ids=["b"]))
    assert r.freed_tokens == 1 and r.receipt.after.protected == 0 and r.receipt.after.evictable == 4
    assert len(a2.results[0].slot_ids) == 1
    assert stub.CheckIntegrity(cache_pb2.CheckIntegrityRequest(pool_id="p")).violations == []

    f = stub.Flush(cache_pb2.FlushRequest(op_id=op(), pool_id="p"))
    assert f.freed_tokens == 4
    pool = stub.GetPool(cache_pb2.GetPoolRequest(pool_id="p")).pools[0]
    assert pool.counters.available == 32 and pool.fundable_tokens == 32 and "min over members" in pool.budget_derivation
