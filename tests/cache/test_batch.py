"""Cache.Batch over a real server: operations applied in order, each as its own RPC (receipt, idempotent replay);
the first that fails ends the call with its status and the ones before it stand."""

from __future__ import annotations

import grpc
import pytest

from common.shortfall import decode_shortfall
from codeserve.v1 import cache_pb2
from tests.cache.conftest import op, register
from tests.cache.test_service import P, allocate, counters, match, session


def cache_op(sid, rid, tokens, finished=True, op_id=None):
    return cache_pb2.BatchOp(cache=cache_pb2.CacheRequestsRequest(
        op_id=op_id or op(), session_id=sid, pool_id=P,
        items=[cache_pb2.CacheItem(request_id=rid, token_ids=tokens, finished=finished)]))


def match_op(sid, rid, tokens, op_id=None):
    return cache_pb2.BatchOp(match=cache_pb2.MatchRequest(
        op_id=op_id or op(), session_id=sid, pool_id=P,
        items=[cache_pb2.MatchItem(request_id=rid, token_ids=tokens, lock=True, max_match_tokens=len(tokens) - 1)]))


def alloc_op(sid, rid, n):
    return cache_pb2.BatchOp(allocate=cache_pb2.AllocateRequest(
        op_id=op(), session_id=sid, pool_id=P, items=[cache_pb2.AllocItem(request_id=rid, num_tokens=n)]))


def release_op(sid, rids):
    return cache_pb2.BatchOp(release=cache_pb2.ReleaseRequestsRequest(
        op_id=op(), session_id=sid, pool_id=P, request_ids=rids))


def test_operations_apply_in_order_each_with_its_receipt(stub) -> None:
    """A finished request cached, another released, then a Match that finds the first's prefix: one call."""
    register(stub, capacity=16)
    sid = session(stub)
    match(stub, sid, "a", [1, 2, 3, 4])
    allocate(stub, sid, [("a", 4)])
    match(stub, sid, "b", [9, 9])
    allocate(stub, sid, [("b", 2)])
    reply = stub.Batch(cache_pb2.BatchRequest(ops=[
        cache_op(sid, "a", [1, 2, 3, 4]), release_op(sid, ["b"]), match_op(sid, "c", [1, 2, 3, 4, 5])]))
    kinds = [r.WhichOneof("result") for r in reply.results]
    assert kinds == ["cache", "release", "match"]
    cached, released, matched = (getattr(r, k) for r, k in zip(reply.results, kinds))
    assert cached.results[0].inserted_tokens == 4 and released.freed_tokens == 2
    assert matched.results[0].cached_tokens == 4  # the insert before it in the same call
    assert matched.receipt.before == released.receipt.after  # one after the other
    assert counters(stub).available == 12


def test_the_first_failure_ends_the_call_and_the_ones_before_stand(stub) -> None:
    """An Allocate the pool cannot fund fails RESOURCE_EXHAUSTED with its shortfall; the cache insert before it is
    applied; the release after it is not."""
    register(stub, capacity=8)
    sid = session(stub)
    match(stub, sid, "a", [1, 2, 3])
    allocate(stub, sid, [("a", 3)])
    match(stub, sid, "b", [])
    with pytest.raises(grpc.RpcError) as exc:
        stub.Batch(cache_pb2.BatchRequest(ops=[cache_op(sid, "a", [1, 2, 3], finished=False), alloc_op(sid, "b", 9),
                                               release_op(sid, ["a"])]))
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert decode_shortfall(exc.value).asked_tokens == 9
    assert counters(stub).protected == 3 and counters(stub).owned == 0  # "a" cached and locked, not released
    with pytest.raises(grpc.RpcError) as exc:
        stub.Batch(cache_pb2.BatchRequest(ops=[release_op(sid, ["nobody"])]))
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND and "nobody" in exc.value.details()
    with pytest.raises(grpc.RpcError) as exc:
        stub.Batch(cache_pb2.BatchRequest(ops=[cache_pb2.BatchOp()]))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "operation 0" in exc.value.details()


def test_a_retried_batch_replays_every_operation(stub) -> None:
    register(stub, capacity=8)
    sid = session(stub)
    match(stub, sid, "a", [1, 2, 3])
    allocate(stub, sid, [("a", 3)])
    request = cache_pb2.BatchRequest(ops=[cache_op(sid, "a", [1, 2, 3]), match_op(sid, "b", [1, 2, 3, 4])])
    first, again = stub.Batch(request), stub.Batch(request)
    assert [r.receipt.replayed for r in (first.results[0].cache, first.results[1].match)] == [False, False]
    assert [r.receipt.replayed for r in (again.results[0].cache, again.results[1].match)] == [True, True]
    assert again.results[1].match.results[0].cached_tokens == 3
