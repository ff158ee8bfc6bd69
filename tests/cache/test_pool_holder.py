"""RegisterPool and the session holding a pool (issue 11): a second scheduler (another owner) registering a
pool that a live session uses gets FAILED_PRECONDITION naming the pool and the owner, instead of flushing it;
a restart of the same owner (a new session), a worker restart (new epoch) and an expired holder still work."""

from __future__ import annotations

import grpc
import pytest

from cache_svc.core import CacheCore
from cache_svc.errors import FailedPrecondition
from cache_svc.items import CacheItem, MatchItem, Member
from codeserve.v1 import cache_pb2
from tests.cache.conftest import op


def register(core: CacheCore, sid: str, epoch: str = "e1"):
    return core.register_pool(op(), "p", 1, [Member("w0", epoch, 64)], session_id=sid)


def cache_prompt(core: CacheCore, sid: str, tokens) -> None:
    rid = op()
    core.match(op(), sid, "p", [MatchItem(rid, "", tuple(tokens), True)])
    core.allocate(op(), sid, "p", [(rid, len(tokens))])
    core.cache_requests(op(), sid, "p", [CacheItem(rid, tuple(tokens), True)])


def cached(core: CacheCore, tokens) -> int:
    return core.probe_prefix("", tokens, ["p"])[0].cached_tokens


def test_another_owner_is_refused_and_the_holder_keeps_its_pool(core) -> None:
    a = core.open_session("scheduler-0").session_id
    assert register(core, a).flushed
    cache_prompt(core, a, [1, 2, 3, 4])
    rid = op()
    core.match(op(), a, "p", [MatchItem(rid, "", (1, 2, 3, 4, 5), True)])   # a running request of A
    b = core.open_session("scheduler-1").session_id
    with pytest.raises(FailedPrecondition, match=r"pool 'p' is held by live session \w+ of owner 'scheduler-0'"):
        register(core, b, epoch="e-other")                                   # a different worker: would flush
    with pytest.raises(FailedPrecondition, match="held by"):
        register(core, b)                                                    # same members: refused all the same
    with pytest.raises(FailedPrecondition, match="without a session"):
        register(core, "")
    assert cached(core, [1, 2, 3, 4]) == 4 and len(core.pools["p"].requests) == 1
    core.allocate(op(), a, "p", [(rid, 1)])                                  # A's request lives on
    assert core.check_integrity("p") == []


def test_a_restart_of_the_same_owner_and_a_worker_restart_re_register(core) -> None:
    a = core.open_session("scheduler-0").session_id
    register(core, a)
    cache_prompt(core, a, [1, 2, 3])
    a2 = core.open_session("scheduler-0").session_id                          # scheduler restart
    again = register(core, a2)
    assert not again.flushed and cached(core, [1, 2, 3]) == 3                 # same worker: the cache stays
    assert register(core, a2, epoch="e2").flushed and cached(core, [1, 2, 3]) == 0   # worker restart: flushed
    b = core.open_session("scheduler-1").session_id
    with pytest.raises(FailedPrecondition, match="'scheduler-0'"):
        register(core, b, epoch="e2")


def test_an_expired_holder_holds_nothing(core, clock) -> None:
    a = core.open_session("scheduler-0", lease_seconds=5).session_id
    register(core, a)
    b = core.open_session("scheduler-1", lease_seconds=60).session_id
    with pytest.raises(FailedPrecondition):
        register(core, b)
    clock.now += 6
    assert not register(core, b).flushed                                     # B holds it now
    with pytest.raises(FailedPrecondition, match="'scheduler-1'"):
        register(core, core.open_session("scheduler-0").session_id)


def test_register_without_a_session_on_a_free_pool_holds_nothing(core) -> None:
    assert register(core, "").flushed
    a = core.open_session("scheduler-0").session_id
    assert not register(core, a).flushed


def test_refusal_over_grpc_names_pool_and_owner(stub) -> None:
    def reg(sid: str, epoch: str):
        return stub.RegisterPool(cache_pb2.RegisterPoolRequest(
            op_id=op(), pool_id="p", page_size=1, session_id=sid,
            members=[cache_pb2.PoolMember(worker_id="w0", epoch=epoch, capacity_tokens=32)]))

    a = stub.OpenSession(cache_pb2.OpenSessionRequest(owner="scheduler-0")).session_id
    b = stub.OpenSession(cache_pb2.OpenSessionRequest(owner="scheduler-1")).session_id
    assert reg(a, "e1").flushed
    with pytest.raises(grpc.RpcError) as err:
        reg(b, "e2")
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "pool 'p' is held by" in err.value.details() and "'scheduler-0'" in err.value.details()
    assert stub.GetPool(cache_pb2.GetPoolRequest(pool_id="p")).pools[0].members[0].epoch == "e1"
