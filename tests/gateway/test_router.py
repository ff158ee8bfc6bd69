"""The routing policies, the cost terms and the pending table (issue 11), as units: the cache's probe answers are
scripted (a fake probe; CacheProbe itself against a fake Cache on a real gRPC port at the end)."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from gateway.cache_probe import CacheProbe, ProbeOutcome
from gateway.pending import PendingTable
from gateway.replica_spec import ReplicaSpec
from gateway.replicas import LoadSnapshot, Replica, ReplicaSet
from gateway.router import Policy, Router, Weights
from gateway.scheduler_client import SchedulerClient
from tests.gateway.fake_cache import FakeCache, serve_cache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class ScriptedProbe:
    """Answers every probe with ``cached`` (replica index -> tokens), less the replicas whose cache 'failed'."""

    def __init__(self) -> None:
        self.cached: dict[int, int] = {}
        self.failed: dict[int, str] = {}

    async def probe(self, namespace, ids, replicas) -> ProbeOutcome:
        out = ProbeOutcome()
        for r in replicas:
            if r.index in self.failed:
                out.errors[r.spec.cache] = self.failed[r.index]
            else:
                out.cached[r.index] = min(self.cached.get(r.index, 0), len(ids))
        return out


def make_set(n: int = 2) -> ReplicaSet:
    replicas = [Replica(i, ReplicaSpec(f"127.0.0.1:{1 + i}", f"cache{i}:1", f"p{i}"),
                        SchedulerClient(f"127.0.0.1:{1 + i}")) for i in range(n)]
    return ReplicaSet(replicas, probe_interval_s=0.5, probe_timeout_s=1, retry_after_s=1, load_interval_s=0)  # no loop runs


def make_router(policy=Policy.CACHE_AWARE, n=2, seed=0, weights=Weights()):
    clock = Clock()
    replicas, pending, probe = make_set(n), PendingTable(2.0, clock), ScriptedProbe()
    return Router(replicas, pending, probe, policy, weights, random.Random(seed)), replicas, pending, probe, clock


def decide(router, ids, namespace="", uses_cache=True):
    return asyncio.run(router.decide(namespace, ids, uses_cache))


def route_and_record(router, pending, ids, rid):
    """Decides and records the pending entry, as the dispatcher does; returns the chosen replica index."""
    d = decide(router, ids)
    pending.add(rid, d.best.replica, "", ids, d.best.uncached)
    return d.best.replica


# --- pending table -----------------------------------------------------------------------------------------------

def test_pending_match_is_whole_pages_per_replica_and_namespace():
    clock = Clock()
    table = PendingTable(2.0, clock)
    table.add("a", 0, "", list(range(100)), 100)
    prompt = list(range(70)) + [999] * 30
    assert table.matched_tokens("", prompt, 0, page_size=16) == 64  # 70 shared, whole pages of 16
    assert table.matched_tokens("", prompt, 0, page_size=1) == 70
    assert table.matched_tokens("", prompt, 1, page_size=1) == 0  # another replica's entry is not this one's
    assert table.matched_tokens("tenant-b", prompt, 0, page_size=1) == 0  # namespaces never share
    assert table.matched_tokens("", list(range(100)), 0, page_size=1) == 99  # the last token is always computed


def test_pending_entries_expire_at_ttl_or_when_removed():
    clock = Clock()
    table = PendingTable(2.0, clock)
    table.add("a", 0, "", [1, 2, 3], 3)
    clock.now += 1.0
    table.add("b", 0, "", [1, 2, 4], 1)
    clock.now += 1.0  # "a" is 2 s old: no longer pending for prefix matching, but its call still counts
    assert [e.key for e in table.entries()] == ["b"]
    assert (table.in_flight(0), table.unstarted_tokens(0)) == (2, 4)
    table.end("b")
    table.end("a")
    assert table.entries() == [] and (table.in_flight(0), table.unstarted_tokens(0)) == (0, 0)
    with pytest.raises(ValueError):
        PendingTable(0)


def test_a_started_call_is_no_longer_pending_but_counts_until_it_ends():
    router, replicas, pending, probe, clock = make_router()
    ids = list(range(100))
    pending.add("a", 0, "", ids, 100)
    pending.started("a")  # its first message came
    assert pending.matched_tokens("", ids, 0, 1) == 0
    d = decide(router, ids)
    r0 = next(c for c in d.ranking if c.replica == 0)
    assert (r0.pending, r0.queued_tokens, r0.requests, r0.cost) == (0, 0, 1, 100 + 16)
    clock.now += 10.0  # however long it runs
    r0 = next(c for c in decide(router, ids).ranking if c.replica == 0)
    assert r0.requests == 1
    pending.end("a")
    r0 = next(c for c in decide(router, ids).ranking if c.replica == 0)
    assert r0.requests == 0 and pending.entries() == []


def test_the_load_is_the_gateways_own_calls_plus_the_others_polled():
    """The gateway counts its own calls itself (placed, not ended; the unstarted ones' predicted prefill) and adds
    the others' load from the last poll (GetLoadResponse.others: calls without its router id), so no poll can race
    one of its calls: neither one routed just before a poll and seen after it (the poll's view misses it: a burst
    split 12 / 20) nor one routed just after a poll and seen by it (counted twice, then kept after it ended: a
    cached prompt sent again went elsewhere at 617 against 600)."""
    router, replicas, pending, probe, clock = make_router()
    ids = list(range(100))
    pending.add("a", 0, "", ids, 100)
    pending.add("b", 0, "", ids, 100)
    pending.started("b")
    replicas.replicas[1].load = LoadSnapshot(others_requests=1, others_waiting_tokens=30)
    other = list(range(200, 300))  # a prompt sharing nothing with theirs
    d = decide(router, other)
    terms = {c.replica: (c.requests, c.queued_tokens, c.cost) for c in d.ranking}
    assert terms == {0: (2, 100, 100 + 100 + 32), 1: (1, 30, 100 + 30 + 16)}
    assert d.best.replica == 1
    pending.end("a")
    pending.end("b")
    r0 = next(c for c in decide(router, other).ranking if c.replica == 0)
    assert (r0.requests, r0.queued_tokens) == (0, 0)


def test_a_placed_call_whose_scheduler_is_known_down_is_not_left_in_flight():
    """Dispatcher.start on a replica whose scheduler was found down between the decision and the call's start
    raises the 503 and leaves nothing counted there."""
    from gateway.dispatch import Dispatcher
    from gateway.errors import ApiError
    from gateway.routing_metrics import RoutingMetrics
    from prometheus_client import CollectorRegistry
    from codeserve.v1 import scheduler_pb2

    router, replicas, pending, probe, clock = make_router()
    dispatcher = Dispatcher(replicas, router, pending, RoutingMetrics(CollectorRegistry(), "m"))
    request = scheduler_pb2.GenerateRequest(request_id="x")
    request.input_ids.ids.extend(range(10))
    router.decide = lambda namespace, ids, uses_cache=True: _decided(router, namespace, ids, uses_cache, 0)

    with pytest.raises(ApiError):
        asyncio.run(dispatcher.start(request, 1, None))
    assert pending.in_flight(0) == 0 and pending.entries() == []
    assert request.router_id == replicas.router_id  # tagged: its scheduler counts it out of the others' load


async def _decided(router, namespace, ids, uses_cache, replica):
    """A decision whose best candidate is ``replica`` (the router's ranking, reordered)."""
    d = await Router.decide(router, namespace, ids, uses_cache)
    best = next(c for c in d.ranking if c.replica == replica)
    router.replicas.replicas[replica].client.down = "scheduler at 127.0.0.1:1 is unreachable"  # found down now
    return type(d)(d.policy, d.prompt_tokens, (best, *[c for c in d.ranking if c is not best]), d.probe_errors)


# --- cache_aware cost --------------------------------------------------------------------------------------------

def test_cache_aware_prefers_the_replica_holding_the_prefix_with_its_cost_terms():
    router, replicas, pending, probe, _ = make_router()
    probe.cached = {1: 96}
    replicas.replicas[1].load = LoadSnapshot(others_requests=3, others_waiting_tokens=30)
    d = decide(router, list(range(100)))
    best, other = d.ranking
    assert best.replica == 1
    assert (best.probed, best.predicted_cached, best.uncached, best.queued_tokens, best.requests) == (96, 96, 4, 30, 3)
    assert best.cost == 4 + 1.0 * 30 + 16.0 * 3  # 82
    assert (other.replica, other.uncached, other.cost) == (0, 100, 100)


def test_hot_prefix_is_copied_when_its_holders_queue_costs_more_than_it_saves():
    router, replicas, pending, probe, _ = make_router()
    probe.cached = {0: 96}
    replicas.replicas[0].load = LoadSnapshot(others_requests=3, others_waiting_tokens=60)  # 4 + 60 + 48 = 112
    d = decide(router, list(range(100)))
    assert d.best.replica == 1 and d.best.cost == 100
    assert d.ranking[1].cost == 4 + 60 + 16 * 3


def test_the_prediction_is_capped_as_the_schedulers_match():
    router, replicas, pending, probe, _ = make_router()
    probe.cached = {0: 100, 1: 100}  # the whole prompt is in both trees
    replicas.replicas[1].page_size = 16
    d = decide(router, list(range(100)))
    assert {c.replica: c.predicted_cached for c in d.ranking} == {0: 99, 1: 96}  # less the last token, whole pages
    d = decide(router, list(range(100)), uses_cache=False)  # prompt logprobs: the scheduler matches nothing
    assert {c.predicted_cached for c in d.ranking} == {0} and {c.uncached for c in d.ranking} == {100}


def test_a_failed_cache_probe_routes_that_replica_as_zero_cached():
    router, replicas, pending, probe, _ = make_router()
    probe.cached = {0: 96}
    probe.failed = {0: "UNAVAILABLE: cache down"}
    d = decide(router, list(range(100)))
    r0 = next(c for c in d.ranking if c.replica == 0)
    assert r0.probed is None and r0.predicted_cached == 0 and r0.uncached == 100
    assert d.probe_errors == {"cache0:1": "UNAVAILABLE: cache down"}


def test_a_burst_of_distinct_prompts_spreads_over_idle_replicas():
    counts = [0, 0]
    router, replicas, pending, probe, _ = make_router(seed=7)
    for i in range(32):
        counts[route_and_record(router, pending, [1000 + i] * 50, f"r{i}")] += 1
    assert 13 <= counts[0] <= 19 and counts[0] + counts[1] == 32  # 40-60 % each (here exactly alternating)


def test_ties_are_broken_at_random_not_always_replica_0():
    firsts = set()
    for seed in range(20):
        router, *_ = make_router(seed=seed)
        firsts.add(decide(router, [5] * 10).best.replica)
    assert firsts == {0, 1}


def test_requests_that_each_find_the_replicas_idle_alternate():
    router, replicas, pending, probe, _ = make_router(seed=11)
    counts = [0, 0, 0]
    router3, *_ = make_router(n=3, seed=5)
    for i in range(32):
        counts[decide(router, [2000 + i] * 20).best.replica] += 1  # nothing pending: each one finds both idle
    assert counts[:2] == [16, 16]
    spread = [0, 0, 0]
    for i in range(30):
        spread[decide(router3, [3000 + i] * 20).best.replica] += 1
    assert spread == [10, 10, 10]


def test_a_burst_of_one_long_prefix_lands_on_one_replica():
    router, replicas, pending, probe, _ = make_router(seed=3)
    prefix = list(range(1000))
    chosen = {route_and_record(router, pending, prefix + [5000 + i] * 8, f"r{i}") for i in range(16)}
    assert len(chosen) == 1
    # the 16th saw 15 pending prompts there: 1000 of its 1008 tokens pending (predicted cached), its own prefill 8
    d = decide(router, prefix + [7000] * 8)
    holder = next(c for c in d.ranking if c.replica in chosen)
    assert (holder.pending, holder.predicted_cached, holder.uncached) == (1000, 1000, 8)
    # queue: the first's 1008 + 15 suffixes of 8 (uncached each), less the 1000 pending tokens this one shares
    assert holder.queued_tokens == 1008 + 15 * 8 - 1000 and holder.requests == 16


def test_n_copies_of_one_prompt_follow_the_first():
    router, replicas, pending, probe, _ = make_router(seed=1)
    ids = list(range(300))
    assert len({route_and_record(router, pending, ids, f"c{i}") for i in range(4)}) == 1


# --- least_load and round_robin ----------------------------------------------------------------------------------

def test_least_load_ignores_the_cache():
    router, replicas, pending, probe, _ = make_router(Policy.LEAST_LOAD)
    probe.cached = {0: 96}
    replicas.replicas[0].load = LoadSnapshot(others_requests=1)
    d = decide(router, list(range(100)))
    assert d.best.replica == 1 and d.best.cost == 0
    assert d.ranking[1].cost == 16.0 and d.ranking[1].predicted_cached == 96  # still probed, for the log


def test_round_robin_takes_replicas_in_turn_and_skips_an_excluded_one():
    router, replicas, *_ = make_router(Policy.ROUND_ROBIN, n=3)
    assert [decide(router, [1, 2]).best.replica for _ in range(4)] == [0, 1, 2, 0]
    replicas.exclude(replicas.replicas[1], "test")
    assert {decide(router, [1, 2]).best.replica for _ in range(4)} == {0, 2}


def test_no_routable_replica_is_a_503_naming_each():
    router, replicas, *_ = make_router()
    for r in replicas.replicas:
        r.client.down = f"{r.name} gone"
    from gateway.errors import ApiError
    with pytest.raises(ApiError) as info:
        decide(router, [1, 2])
    assert info.value.status == 503
    assert "r0 (127.0.0.1:1): r0 gone" in info.value.message and "r1 (127.0.0.1:2): r1 gone" in info.value.message


# --- CacheProbe over real gRPC -----------------------------------------------------------------------------------

def test_cache_probe_makes_one_call_per_cache_address_and_reports_a_failed_one():
    fake_a, fake_b = FakeCache(page_size=4), FakeCache()
    server_a, server_b = serve_cache(fake_a), serve_cache(fake_b)
    try:
        a, b = f"127.0.0.1:{server_a.port}", f"127.0.0.1:{server_b.port}"
        specs = [ReplicaSpec("s:1", a, "p0"), ReplicaSpec("s:2", a, "p1"), ReplicaSpec("s:3", b, "p2")]
        replicas = [Replica(i, s, SchedulerClient(s.scheduler)) for i, s in enumerate(specs)]
        fake_a.cached = {"p0": 30, "p1": 7}
        fake_b.error = (grpc.StatusCode.UNAVAILABLE, "cache b is down")

        async def run():
            probe = CacheProbe(timeout_s=2.0)
            try:
                return await probe.probe("ns", list(range(40)), replicas)
            finally:
                await probe.close()

        out = asyncio.run(run())
        assert out.cached == {0: 28, 1: 4}  # whole pages of 4
        assert out.errors == {b: "UNAVAILABLE: cache b is down"}
        assert [list(r.pool_ids) for r in fake_a.requests] == [["p0", "p1"]]  # one call covering both pools
        assert fake_a.requests[0].namespace == "ns" and len(fake_a.requests[0].token_ids) == 40
        assert replicas[0].page_size == 4 and replicas[2].page_size == 1
    finally:
        server_a.server.stop(0)
        server_b.server.stop(0)


def test_a_call_that_failed_and_was_then_cancelled_ends_once():
    """A call refused without a retry (here a 400) ends at its failure; the stream's cancel afterwards (always
    called) ends nothing more: the replica's count of the gateway's calls is back to the other one placed."""
    from prometheus_client import CollectorRegistry

    from codeserve.v1 import scheduler_pb2
    from gateway.dispatch import Dispatcher, RouteHooks
    from gateway.errors import ApiError
    from gateway.routing_metrics import RoutingMetrics

    router, replicas, pending, probe, clock = make_router()
    dispatcher = Dispatcher(replicas, router, pending, RoutingMetrics(CollectorRegistry(), "m"))
    ids = list(range(50))
    request = scheduler_pb2.GenerateRequest(request_id="x-0", input_ids=scheduler_pb2.TokenIds(ids=ids))
    decision = decide(router, ids)
    hooks = RouteHooks(dispatcher, request, decision)
    hooks.place(0)
    target = decision.best.replica
    pending.add("other", target, "", [7] * 10, 10)  # another call of the gateway there
    assert pending.in_flight(target) == 2
    assert hooks.failed(grpc.StatusCode.INVALID_ARGUMENT, ApiError(400, "bad", "invalid_request_error"), True) is None
    hooks.ended()  # GenerationStream.cancel, as every fan-out does at the end
    assert pending.in_flight(target) == 1
    r = next(c for c in decide(router, ids).ranking if c.replica == target)
    assert r.requests == 1  # the other call


def test_two_calls_with_one_request_id_count_as_two():
    """A client may give two calls the same request id (a native batch with a repeated rid): routed to two replicas
    both run, and each counts on its replica until it ends (keyed by call, not by request id)."""
    from prometheus_client import CollectorRegistry

    from codeserve.v1 import scheduler_pb2
    from gateway.dispatch import Dispatcher, RouteHooks
    from gateway.routing_metrics import RoutingMetrics

    router, replicas, pending, probe, clock = make_router()
    dispatcher = Dispatcher(replicas, router, pending, RoutingMetrics(CollectorRegistry(), "m"))
    ids = list(range(50))
    request = scheduler_pb2.GenerateRequest(request_id="dup", input_ids=scheduler_pb2.TokenIds(ids=ids))
    first = RouteHooks(dispatcher, request, decide(router, ids))
    first.place(0)
    second = RouteHooks(dispatcher, request, decide(router, ids))
    second.place(0)
    assert pending.in_flight(0) == 2
    first.ended()
    assert pending.in_flight(0) == 1
    second.ended()
    assert pending.in_flight(0) == 0
