"""Cache.ProbePrefix: the read-only probe a router asks before it picks a replica (issue 11).

Unit tests on the core (the probed length is what a Match finds; whole pages at page sizes 1 and 16), a
hypothesis property (a probe between operations changes nothing observable: tree, node count, access times,
counters, statistics, eviction order), and the RPC through a real server.
"""

from __future__ import annotations

import uuid

import grpc
import pytest
from hypothesis import given, settings, strategies as st

from cache_svc.core import CacheCore
from cache_svc.errors import InvalidArgument, NotFound
from cache_svc.items import CacheItem, MatchItem, Member
from codeserve.v1 import cache_pb2
from tests.cache.conftest import register


def op() -> str:
    return uuid.uuid4().hex


def make(page_size: int = 1, capacity: int = 256, pools=("p",)) -> tuple[CacheCore, str]:
    core = CacheCore(lease_seconds=3600)
    for pid in pools:
        core.register_pool(op(), pid, page_size, [Member("w0", f"epoch-{pid}", capacity)])
    return core, core.open_session("sched").session_id


def run(core: CacheCore, sid: str, tokens, pool: str = "p", ns: str = "") -> None:
    """Match+lock, allocate the rest, cache as finished."""
    rid = op()
    (m,) = core.match(op(), sid, pool, [MatchItem(rid, ns, tuple(tokens), True)]).results
    core.allocate(op(), sid, pool, [(rid, len(tokens) - m.cached_tokens)])
    core.cache_requests(op(), sid, pool, [CacheItem(rid, tuple(tokens), True)])


def matched(core: CacheCore, sid: str, tokens, pool: str = "p", ns: str = "") -> int:
    """What a non-locking Match finds (it may split a node; sizes stay)."""
    return core.match(op(), sid, pool, [MatchItem("", ns, tuple(tokens), False)]).results[0].cached_tokens


def snapshot(core: CacheCore, pool_id: str = "p"):
    """Everything a probe could disturb: nodes (id, path, slots, lock ref, access time), the tick, counters,
    match statistics, free pages, requests."""
    pool = core.pools[pool_id]
    tree = pool.tree
    nodes = sorted((n.id, n.namespace, tuple(tree.path_key(n)[0]), tuple(n.value), n.lock_ref, n.last_access)
                   for n in tree.nodes())
    return (nodes, tree._tick, pool.counters(), pool.match_query_tokens, pool.match_hit_tokens,
            sorted(pool.allocator.free_page_ids()), sorted(rid for _, rid in pool.requests), len(core.ops._entries))


@pytest.mark.parametrize("page_size", [1, 16])
def test_probed_length_is_what_match_finds_in_whole_pages(page_size) -> None:
    core, sid = make(page_size, capacity=2048)
    base = list(range(1000, 1000 + 5 * page_size + 3))           # 5 whole pages and 3 tokens
    run(core, sid, base)
    run(core, sid, base[: 2 * page_size] + [7] * (3 * page_size))  # a branch after 2 pages
    cases = [base, base[:-3], base[: 3 * page_size + 1], base[: page_size - 1] if page_size > 1 else [],
             base[: 2 * page_size] + [7] * (page_size + 2), base[: 2 * page_size] + [8] * page_size, [5, 6, 7], []]
    for tokens in cases:
        (probe,) = core.probe_prefix("", tokens, ["p"])
        assert probe.cached_tokens % page_size == 0
        assert probe.cached_tokens == matched(core, sid, tokens), tokens
    def whole(n: int) -> int:
        return n - n % page_size

    assert core.probe_prefix("", base, ["p"])[0].cached_tokens == whole(5 * page_size + 3)  # 16: the tail is no page
    assert core.probe_prefix("", base[: 3 * page_size + 1], ["p"])[0].cached_tokens == whole(3 * page_size + 1)
    branch = base[: 2 * page_size] + [7] * (page_size + 2)
    assert core.probe_prefix("", branch, ["p"])[0].cached_tokens == whole(3 * page_size + 2)
    assert core.probe_prefix("", [], ["p"])[0].cached_tokens == 0
    assert core.probe_prefix("other-namespace", base, ["p"])[0].cached_tokens == 0


def test_probe_mid_node_does_not_split_it() -> None:
    core, sid = make(page_size=4)
    run(core, sid, list(range(40)))
    before = snapshot(core)
    assert core.probe_prefix("", list(range(18)), ["p"])[0].cached_tokens == 16   # ends inside the one node
    assert snapshot(core) == before and len(list(core.pools["p"].tree.nodes())) == 1
    matched(core, sid, list(range(18)))                                            # a Match splits it
    assert len(list(core.pools["p"].tree.nodes())) == 2


def test_probe_reports_each_pool_with_epochs_budget_capacity_page_size() -> None:
    core, sid = make(page_size=4, capacity=64, pools=("b", "a", "c"))
    run(core, sid, list(range(12)), pool="b")
    rid = op()
    core.match(op(), sid, "c", [MatchItem(rid, "", (), True)])
    core.allocate(op(), sid, "c", [(rid, 10)])                                      # 3 pages owned in c
    probes = core.probe_prefix("", list(range(12)), ["c", "b"])
    assert [(p.pool_id, p.epochs, p.cached_tokens, p.fundable_tokens, p.capacity, p.page_size) for p in probes] == [
        ("c", ("epoch-c",), 0, 64 - 12, 64, 4), ("b", ("epoch-b",), 12, 64, 64, 4)]
    assert [p.pool_id for p in core.probe_prefix("", [1], [])] == ["a", "b", "c"]  # empty = all, id order


def test_probe_errors_name_the_pool_and_answer_nothing() -> None:
    core, _ = make(pools=("a",))
    with pytest.raises(NotFound, match="'zz'"):
        core.probe_prefix("", [1, 2], ["a", "zz"])
    with pytest.raises(InvalidArgument, match="twice"):
        core.probe_prefix("", [1, 2], ["a", "a"])


def test_probe_does_not_keep_a_prefix_warm_for_eviction() -> None:
    """The LRU leaf after a probe of it is still the one evicted; a Match of it (which touches) saves it."""
    def setup():
        core, sid = make()
        run(core, sid, [1, 2, 3])       # oldest
        run(core, sid, [9, 8, 7])
        return core, sid

    core, _ = setup()
    core.probe_prefix("", [1, 2, 3], ["p"])
    core.evict(op(), "p", 1)
    assert core.probe_prefix("", [1, 2, 3], ["p"])[0].cached_tokens == 0
    assert core.probe_prefix("", [9, 8, 7], ["p"])[0].cached_tokens == 3

    core, sid = setup()
    matched(core, sid, [1, 2, 3])     # the touching read this probe must not be
    core.evict(op(), "p", 1)
    assert core.probe_prefix("", [1, 2, 3], ["p"])[0].cached_tokens == 3
    assert core.probe_prefix("", [9, 8, 7], ["p"])[0].cached_tokens == 0


TOKENS = st.lists(st.integers(0, 3), max_size=12)
OPS = st.lists(st.one_of(
    st.tuples(st.just("run"), st.sampled_from(["", "ns"]), TOKENS),
    st.tuples(st.just("lock"), st.sampled_from(["", "ns"]), TOKENS),
    st.tuples(st.just("release"), st.integers(0, 5)),
    st.tuples(st.just("evict"), st.integers(0, 8)),
    st.tuples(st.just("match"), st.sampled_from(["", "ns"]), TOKENS),
), max_size=25)


@settings(max_examples=150, deadline=None)
@given(page_size=st.sampled_from([1, 2, 4]), ops=OPS,
       probes=st.lists(st.tuples(st.sampled_from(["", "ns"]), TOKENS), min_size=1, max_size=4))
def test_probes_between_operations_change_nothing_observable(page_size, ops, probes) -> None:
    """Two cores run the same operations; one is probed before every operation. After each operation both
    are identical (nodes, access times, counters, statistics, free pages), and evicting one leaf at a time
    at the end removes the same nodes in the same order."""
    plain, probed = make(page_size, capacity=64), make(page_size, capacity=64)
    locked: dict[int, list[str]] = {0: [], 1: []}
    for step in ops:
        for k, (core, sid) in enumerate((plain, probed)):
            if k == 1:
                for ns, tokens in probes:
                    core.probe_prefix(ns, tokens, [])
            kind = step[0]
            if kind in ("run", "lock"):
                _, ns, tokens = step
                rid = f"r{len(locked[k])}-{kind}"
                (m,) = core.match(f"{k}-{rid}-m", sid, "p", [MatchItem(rid, ns, tuple(tokens), True)]).results
                free = core.pools["p"].counters().fundable
                want = min(len(tokens) - m.cached_tokens, free - page_size)
                core.allocate(f"{k}-{rid}-a", sid, "p", [(rid, max(0, want))])
                if kind == "run":
                    done = tokens[: m.cached_tokens + max(0, want)]
                    core.cache_requests(f"{k}-{rid}-c", sid, "p", [CacheItem(rid, tuple(done), True)])
                    locked[k].append("")
                else:
                    locked[k].append(rid)
            elif kind == "release":
                live = [r for r in locked[k] if r]
                if live:
                    rid = live[step[1] % len(live)]
                    core.release_requests(op(), sid, "p", [rid])
                    locked[k][locked[k].index(rid)] = ""
            elif kind == "evict":
                core.evict(op(), "p", step[1])
            else:
                core.match(op(), sid, "p", [MatchItem("", step[1], tuple(step[2]), False)])
        assert snapshot(plain[0])[:-1] == snapshot(probed[0])[:-1]
        assert core.check_integrity("p") == []
    order = []
    for core, _ in (plain, probed):
        removed = []
        while core.pools["p"].counters().evictable:
            core.pools["p"].tree.evict(1, lambda slots: removed.append(tuple(slots)))
        order.append(removed)
    assert order[0] == order[1]


def test_probe_prefix_over_grpc(stub) -> None:
    register(stub, pool_id="p1", capacity=64, page_size=4, epoch="boot-1")
    register(stub, pool_id="p2", capacity=32, page_size=4, epoch="boot-2")
    sid = stub.OpenSession(cache_pb2.OpenSessionRequest(owner="s")).session_id
    prompt = list(range(50, 61))  # 11 tokens: 2 whole pages
    stub.Match(cache_pb2.MatchRequest(op_id=op(), session_id=sid, pool_id="p1", items=[
        cache_pb2.MatchItem(request_id="a", token_ids=prompt, lock=True)]))
    stub.Allocate(cache_pb2.AllocateRequest(op_id=op(), session_id=sid, pool_id="p1", items=[
        cache_pb2.AllocItem(request_id="a", num_tokens=11)]))
    stub.CacheRequests(cache_pb2.CacheRequestsRequest(op_id=op(), session_id=sid, pool_id="p1", items=[
        cache_pb2.CacheItem(request_id="a", token_ids=prompt, finished=True)]))
    before = stub.GetPool(cache_pb2.GetPoolRequest())
    reply = stub.ProbePrefix(cache_pb2.ProbePrefixRequest(token_ids=prompt + [1], pool_ids=["p2", "p1"]))
    assert [(p.pool_id, list(p.epochs), p.cached_tokens, p.fundable_tokens, p.capacity, p.page_size)
            for p in reply.pools] == [("p2", ["boot-2"], 0, 32, 32, 4), ("p1", ["boot-1"], 8, 64, 64, 4)]
    assert [p.pool_id for p in stub.ProbePrefix(cache_pb2.ProbePrefixRequest(token_ids=prompt)).pools] == ["p1", "p2"]
    assert stub.GetPool(cache_pb2.GetPoolRequest()) == before   # counters and match statistics untouched
    with pytest.raises(grpc.RpcError) as err:
        stub.ProbePrefix(cache_pb2.ProbePrefixRequest(token_ids=prompt, pool_ids=["p1", "nope"]))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "'nope'" in err.value.details()
    assert stub.ProbePrefix(cache_pb2.ProbePrefixRequest(pool_ids=["p1"])).pools[0].cached_tokens == 0
