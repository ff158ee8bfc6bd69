"""Service tests against a real server on a real port through the generated stubs."""

from __future__ import annotations

import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.shortfall import decode_shortfall
from codeserve.v1 import cache_pb2
from tests.cache.conftest import op, register

P = "p"


def session(stub, owner: str = "scheduler-0", lease: float = 0.0) -> str:
    return stub.OpenSession(cache_pb2.OpenSessionRequest(owner=owner, lease_seconds=lease)).session_id


def match(stub, sid, rid, tokens, lock=True, cap=0, ns="", op_id=None):
    return stub.Match(cache_pb2.MatchRequest(op_id=op() if op_id is None else op_id, session_id=sid, pool_id=P, items=[
        cache_pb2.MatchItem(request_id=rid, namespace=ns, token_ids=tokens, lock=lock, max_match_tokens=cap)]))


def allocate(stub, sid, items, op_id=None):
    return stub.Allocate(cache_pb2.AllocateRequest(op_id=op() if op_id is None else op_id, session_id=sid, pool_id=P, items=[
        cache_pb2.AllocItem(request_id=r, num_tokens=n) for r, n in items]))


def cache(stub, sid, rid, tokens, finished=True):
    return stub.CacheRequests(cache_pb2.CacheRequestsRequest(op_id=op(), session_id=sid, pool_id=P, items=[
        cache_pb2.CacheItem(request_id=rid, token_ids=tokens, finished=finished)]))


def release(stub, sid, rids):
    return stub.ReleaseRequests(cache_pb2.ReleaseRequestsRequest(op_id=op(), session_id=sid, pool_id=P, request_ids=rids))


def counters(stub) -> cache_pb2.Counters:
    return stub.GetPool(cache_pb2.GetPoolRequest(pool_id=P)).pools[0].counters


def code_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as exc:
        call()
    return exc.value.code(), exc.value.details()


def test_health_is_serving(server, stub) -> None:
    chan = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    resp = health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(service="codeserve.v1.Cache"))
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    chan.close()


def test_idempotent_retry_returns_first_receipt_and_allocates_once(stub) -> None:
    register(stub, capacity=8)
    sid = session(stub)
    match(stub, sid, "a", [1, 2, 3])
    first = allocate(stub, sid, [("a", 3)], op_id="alloc-1")
    again = allocate(stub, sid, [("a", 3)], op_id="alloc-1")
    assert not first.receipt.replayed and again.receipt.replayed
    assert list(again.results[0].slot_ids) == list(first.results[0].slot_ids)
    assert counters(stub).available == 5 and counters(stub).owned == 3
    code, details = code_of(lambda: allocate(stub, sid, [("a", 1)], op_id="alloc-1"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "different call" in details
    code, details = code_of(lambda: allocate(stub, sid, [("a", 1)], op_id=""))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "op_id" in details


def test_resource_exhausted_carries_a_decodable_shortfall(stub) -> None:
    register(stub, capacity=8)
    sid = session(stub)
    match(stub, sid, "hold", [1, 2, 3])
    allocate(stub, sid, [("hold", 3)])
    cache(stub, sid, "hold", [1, 2, 3], finished=True)       # 3 evictable
    match(stub, sid, "a", [])
    match(stub, sid, "b", [])
    with pytest.raises(grpc.RpcError) as exc:
        allocate(stub, sid, [("a", 5), ("b", 4)])
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    s = decode_shortfall(exc.value)
    assert s is not None
    assert (s.asked_tokens, s.freed_by_eviction, s.still_evictable, s.available) == (9, 3, 0, 8)
    assert s.counters.capacity == 8 and "needed 9 tokens" in s.reason
    ok = allocate(stub, sid, [("a", 5), ("b", 3)])             # nothing was allocated by the failure
    assert ok.receipt.before.available == 8 and ok.receipt.after.available == 0


def test_relief_ladder_evicts_inside_allocate_and_reports_it(stub) -> None:
    register(stub, capacity=8)
    sid = session(stub)
    match(stub, sid, "x", [])
    allocate(stub, sid, [("x", 6)])
    cache(stub, sid, "x", [1, 2, 3, 4, 5, 6])
    match(stub, sid, "y", [9])
    out = allocate(stub, sid, [("y", 4)])
    assert out.relief.asked_tokens == 2 and out.relief.freed_tokens == 6 and out.relief.nodes_evicted == 1
    assert out.receipt.after.available == 4


def test_session_replaced_while_holding_locks_releases_everything(stub) -> None:
    register(stub, capacity=16)
    old = session(stub)
    match(stub, old, "a", [1, 2, 3, 4])
    allocate(stub, old, [("a", 4)])
    cache(stub, old, "a", [1, 2, 3, 4], finished=False)        # a keeps a lock on [1,2,3,4]
    match(stub, old, "b", [1, 2, 3, 4, 5], cap=4)
    allocate(stub, old, [("b", 1)])
    assert counters(stub).protected == 4 and counters(stub).owned == 1
    resp = stub.OpenSession(cache_pb2.OpenSessionRequest(owner="scheduler-0"))
    assert resp.replaced_session_id == old and resp.released_requests == 2
    c = counters(stub)
    assert (c.protected, c.owned, c.evictable, c.available) == (0, 0, 4, 12)
    code, details = code_of(lambda: allocate(stub, old, [("a", 1)]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "replaced" in details
    code, _ = code_of(lambda: stub.RenewSession(cache_pb2.RenewSessionRequest(session_id=old)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert stub.CheckIntegrity(cache_pb2.CheckIntegrityRequest(pool_id=P)).violations == []


def test_expired_lease_releases_and_refuses_the_session(stub, clock) -> None:
    register(stub, capacity=16)
    sid = session(stub, lease=5)
    match(stub, sid, "a", [])
    allocate(stub, sid, [("a", 3)])
    clock.now += 4
    assert stub.RenewSession(cache_pb2.RenewSessionRequest(session_id=sid)).lease_seconds_left == 5
    clock.now += 6
    assert counters(stub).owned == 0 and counters(stub).available == 16
    code, details = code_of(lambda: allocate(stub, sid, [("a", 1)]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "expired" in details


def test_new_epoch_flushes_the_pool_and_its_requests(stub) -> None:
    register(stub, capacity=16, epoch="boot-1")
    sid = session(stub)
    match(stub, sid, "a", [])
    allocate(stub, sid, [("a", 4)])
    cache(stub, sid, "a", [1, 2, 3, 4], finished=False)
    assert not register(stub, capacity=16, epoch="boot-1").flushed   # same epoch: nothing changes
    assert counters(stub).protected == 4
    again = register(stub, capacity=16, epoch="boot-2")
    assert again.flushed and again.receipt.before.protected == 4
    c = counters(stub)
    assert (c.available, c.cached, c.owned) == (16, 0, 0)
    code, details = code_of(lambda: release(stub, sid, ["a"]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "flushed" in details
    assert match(stub, sid, "a", [1, 2, 3, 4]).results[0].cached_tokens == 0   # the id can be registered again


def test_group_capacity_is_the_minimum_over_members(stub) -> None:
    resp = register(stub, page_size=4, members=[("tp0", "e", 100), ("tp1", "e", 61)])
    assert resp.capacity == 60
    pool = stub.GetPool(cache_pb2.GetPoolRequest(pool_id=P)).pools[0]
    assert pool.counters.capacity == 60 and pool.fundable_tokens == 60 and "tp1=61" in pool.budget_derivation
    resp = register(stub, page_size=4, members=[("tp0", "e", 100), ("tp1", "e2", 40)])
    assert resp.flushed and resp.capacity == 40


def test_namespaces_never_share_a_prefix(stub) -> None:
    register(stub, capacity=16)
    sid = session(stub)
    match(stub, sid, "a", [1, 2, 3], ns="salt-a")
    allocate(stub, sid, [("a", 3)])
    cache(stub, sid, "a", [1, 2, 3])
    assert match(stub, sid, "b", [1, 2, 3], ns="salt-b").results[0].cached_tokens == 0
    assert match(stub, sid, "c", [1, 2, 3], ns="salt-a").results[0].cached_tokens == 3
    assert match(stub, sid, "d", [1, 2, 3]).results[0].cached_tokens == 0


def test_decode_allocation_for_many_requests_in_one_rpc(stub) -> None:
    register(stub, capacity=300)
    sid = session(stub)
    stub.Match(cache_pb2.MatchRequest(op_id=op(), session_id=sid, pool_id=P, items=[
        cache_pb2.MatchItem(request_id=f"r{i}", token_ids=[i], lock=True) for i in range(256)]))
    out = allocate(stub, sid, [(f"r{i}", 1) for i in range(256)])
    slots = [s for r in out.results for s in r.slot_ids]
    assert [r.request_id for r in out.results] == [f"r{i}" for i in range(256)]
    assert len(set(slots)) == 256 and 0 not in slots and out.receipt.after.available == 44


def test_error_statuses(stub) -> None:
    I, N, F = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION
    sid = session(stub)
    assert code_of(lambda: match(stub, sid, "a", [1]))[0] == N                           # unknown pool
    register(stub, capacity=8, page_size=2)
    assert code_of(lambda: match(stub, "nope", "a", [1]))[0] == N                        # unknown session
    assert code_of(lambda: match(stub, "", "a", [1]))[0] == I
    assert code_of(lambda: allocate(stub, sid, [("ghost", 1)]))[0] == N                  # unknown request
    assert code_of(lambda: release(stub, sid, ["ghost"]))[0] == N
    assert code_of(lambda: match(stub, sid, "", [1]))[0] == I                            # lock without id
    match(stub, sid, "a", [1, 2])
    assert code_of(lambda: match(stub, sid, "a", [1, 2]))[0] == F                        # registered twice
    assert code_of(lambda: allocate(stub, sid, [("a", -1)]))[0] == I
    assert code_of(lambda: allocate(stub, sid, [("a", 1), ("a", 1)]))[0] == I
    allocate(stub, sid, [("a", 2)])
    code, details = code_of(lambda: cache(stub, sid, "a", [1, 2, 3]))                    # more tokens than slots
    assert code == I and "only 2 slots" in details
    release(stub, sid, ["a"])
    code, details = code_of(lambda: release(stub, sid, ["a"]))                          # double release
    assert code == F and "already released" in details
    assert code_of(lambda: allocate(stub, sid, [("a", 1)]))[0] == F                      # use after release
    assert code_of(lambda: stub.Evict(cache_pb2.EvictRequest(op_id=op(), pool_id=P, num_tokens=-1)))[0] == I
    assert code_of(lambda: register(stub, pool_id="q", page_size=0))[0] == I
    assert code_of(lambda: register(stub, pool_id="q", capacity=1, page_size=4))[0] == I
    assert code_of(lambda: register(stub, pool_id="q", members=[("w", "e", 8), ("w", "e", 8)]))[0] == I
    assert code_of(lambda: stub.GetPool(cache_pb2.GetPoolRequest(pool_id="zz")))[0] == N
    assert code_of(lambda: stub.CheckIntegrity(cache_pb2.CheckIntegrityRequest(pool_id="zz")))[0] == N
    assert code_of(lambda: stub.OpenSession(cache_pb2.OpenSessionRequest(owner="")))[0] == I
    c = counters(stub)
    assert (c.available, c.owned, c.protected) == (8, 0, 0)                               # errors changed nothing


def test_watch_events_streams_stored_removed_and_flushed(stub) -> None:
    register(stub, capacity=16)
    sid = session(stub)
    got: list[cache_pb2.PrefixEvent] = []
    stream = stub.WatchEvents(cache_pb2.WatchEventsRequest(pool_id=P))
    done = threading.Event()

    def read() -> None:
        for event in stream:
            got.append(event)
            if len(got) == 3:
                done.set()
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    match(stub, sid, "a", [])
    allocate(stub, sid, [("a", 3)])
    cache(stub, sid, "a", [7, 8, 9])
    stub.Flush(cache_pb2.FlushRequest(op_id=op(), pool_id=P))
    register(stub, capacity=16, epoch="e2")
    assert done.wait(10), f"only {len(got)} events arrived"
    stream.cancel()
    assert [(e.sequence, e.kind, list(e.token_ids), e.num_tokens) for e in got] == [
        (1, "stored", [7, 8, 9], 3), (2, "removed", [7, 8, 9], 3), (3, "flushed", [], 0)]
    code, _ = code_of(lambda: next(iter(stub.WatchEvents(cache_pb2.WatchEventsRequest(pool_id="zz")))))
    assert code == grpc.StatusCode.NOT_FOUND


def test_paged_chunked_prefill_then_decode_through_the_service(stub) -> None:
    """page_size 4: chunk 1 (6 tokens) cached unfinished keeps the partial page owned; decode fills that
    page before taking a new one; a second request then hits the cached whole pages."""
    reg = register(stub, capacity=32, page_size=4)
    assert reg.page_size == 4 and reg.capacity == 32
    sid = session(stub)
    prompt = list(range(100, 110))
    match(stub, sid, "a", prompt, cap=len(prompt) - 1)
    chunk1 = list(allocate(stub, sid, [("a", 6)]).results[0].slot_ids)
    assert all(s >= 4 for s in chunk1) and chunk1[:4] == list(range(chunk1[0], chunk1[0] + 4))
    c = cache(stub, sid, "a", prompt[:6], finished=False)
    assert (c.results[0].inserted_tokens, list(c.results[0].prefix_slot_ids)) == (4, chunk1[:4])
    assert c.receipt.after.protected == 4 and c.receipt.after.owned == 4        # the partial page stays owned
    chunk2 = list(allocate(stub, sid, [("a", 4)]).results[0].slot_ids)
    assert chunk2[0] == chunk1[5] + 1                                          # fills the partial page first
    decode = list(allocate(stub, sid, [("a", 1)]).results[0].slot_ids)
    assert decode[0] % 4 == 2                                                  # position 10 is offset 2 of page 2
    done = cache(stub, sid, "a", prompt + [7], finished=True)
    assert done.results[0].already_cached_tokens == 4 and done.results[0].inserted_tokens == 4
    assert done.receipt.after.owned == 0 and done.receipt.after.evictable == 8
    hit = match(stub, sid, "b", prompt + [7, 8], cap=10)
    assert hit.results[0].cached_tokens == 8
    assert stub.CheckIntegrity(cache_pb2.CheckIntegrityRequest(pool_id=P)).violations == []
