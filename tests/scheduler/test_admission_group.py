"""Admission locks the waiting requests' prefixes a group at a time (``planner.ADMIT_GROUP`` per Match): one Match
RPC per group instead of one per request, the head of a group judged again without the others' locks when they
keep it out, and every lock not admitted let go in one ReleaseRequests. The planner on its own, with a recording
stand-in for the cache (the admission on real receipts end to end is tests/scheduler/test_small_pool.py's)."""

import structlog

from codeserve.v1 import cache_pb2, common_pb2
from scheduler_svc.admission import NewTokenRatio
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.intake import Intake
from scheduler_svc.planner import ADMIT_GROUP, Planner
from scheduler_svc.request import Params, Req, State
from scheduler_svc.requests import RequestTable
from scheduler_svc.stats import Stats


class Cache:
    """Records Match / Allocate / ReleaseRequests calls. Nothing is cached. ``locked_fund``: the fundable tokens
    the Match receipt reports after its locks (``released_fund`` after a release)."""

    def __init__(self, locked_fund: int = 1 << 20, released_fund: int = 1 << 20) -> None:
        self.matches: list[list[str]] = []
        self.releases: list[list[str]] = []
        self.allocates: list[list[tuple[str, int]]] = []
        self.locked_fund, self.released_fund = locked_fund, released_fund

    def match(self, items):
        items = list(items)
        self.matches.append([it.request_id for it in items])
        after = cache_pb2.Counters(capacity=1 << 20, available=self.locked_fund)
        return cache_pb2.MatchResponse(receipt=cache_pb2.Receipt(after=after), results=[
            cache_pb2.MatchResult(request_id=it.request_id, cached_tokens=0) for it in items])

    def defer_release(self, rids):
        if rids:
            self.release_requests(rids)

    def defer_cache(self, items):
        pass

    deferred_ends = 0  # its defer_* send at once

    def flush_deferred(self) -> None:
        pass

    def release_requests(self, rids):
        self.releases.append(list(rids))
        after = cache_pb2.Counters(capacity=1 << 20, available=self.released_fund)
        return cache_pb2.ReleaseRequestsResponse(receipt=cache_pb2.Receipt(after=after))

    def allocate(self, items):
        items = list(items)
        self.allocates.append(items)
        nxt, results = 100, []
        for rid, n in items:
            results.append(cache_pb2.AllocResult(request_id=rid, slot_ids=range(nxt, nxt + n)))
            nxt += n
        return cache_pb2.AllocateResponse(results=results)


def _req(rid: str, prompt: int, max_new: int = 4) -> Req:
    return Req(rid=rid, prompt_ids=list(range(1, prompt + 1)), params=Params(
        max_new_tokens=max_new, asked_max_new_tokens=max_new, sampling=common_pb2.SamplingParams(), ignore_eos=True))


def _planner(cache: Cache, waiting: list[Req], chunk: int = 4096, running: int = 64) -> Planner:
    table = RequestTable(cache, None, Intake(64), structlog.get_logger())
    table.waiting.extend(waiting)
    cfg = SchedulerConfig(chunk_size=chunk, max_running_requests=running)
    return Planner(table, cache, cfg, NewTokenRatio(), Stats(), structlog.get_logger())


def test_arrivals_of_one_round_are_matched_in_one_rpc():
    cache = Cache()
    reqs = [_req(f"r{i}", 30) for i in range(5)]
    batch = _planner(cache, reqs).extend()
    assert [e.req.rid for e in batch.entries] == [r.rid for r in reqs]
    assert all(r.state == State.PREFILL for r in reqs)
    assert cache.matches == [[r.rid for r in reqs]]  # was one Match per request
    assert cache.allocates == [[(r.rid, 30) for r in reqs]] and cache.releases == []


def test_more_arrivals_than_a_group_take_one_match_per_group():
    cache = Cache()
    reqs = [_req(f"r{i}", 10) for i in range(ADMIT_GROUP + 3)]
    _planner(cache, reqs).extend()
    assert cache.matches == [[r.rid for r in reqs[:ADMIT_GROUP]], [r.rid for r in reqs[ADMIT_GROUP:]]]


def test_the_group_is_no_larger_than_the_room_left():
    cache = Cache()
    reqs = [_req(f"r{i}", 10) for i in range(5)]
    p = _planner(cache, reqs, running=3)
    p.extend()
    assert cache.matches == [["r0", "r1", "r2"]] and cache.releases == []
    assert [r.rid for r in p.table.waiting] == ["r3", "r4"]


def test_candidates_locked_past_the_chunk_budget_are_unlocked_in_one_release():
    cache = Cache()
    reqs = [_req(f"r{i}", 300) for i in range(4)]
    p = _planner(cache, reqs, chunk=400)  # r0 takes 300, r1 the last 100 (chunked), r2 and r3 are not reached
    batch = p.extend()
    assert [(e.req.rid, e.n) for e in batch.entries] == [("r0", 300), ("r1", 100)]
    assert cache.matches == [["r0", "r1", "r2", "r3"]] and cache.releases == [["r2", "r3"]]
    assert [r.rid for r in p.table.waiting] == ["r2", "r3"]


def test_a_head_kept_out_by_its_groups_locks_is_judged_again_without_them():
    """After the group's Match the pool funds only 10 tokens (the others' locked prefixes are not evictable); once
    they are let go it funds plenty: the head is admitted (judged on the release's counters), the others are
    matched again in a group of their own and admitted too. Without the second look the head would be deferred
    round after round by the locks of the requests queued behind it."""
    cache = Cache(locked_fund=10, released_fund=1 << 20)
    reqs = [_req(f"r{i}", 30) for i in range(3)]
    p = _planner(cache, reqs)
    p.table.running.append(_req("busy", 5))  # not idle: a request that does not fit is deferred, not refused
    p.table.running[0].phase = State.DECODE
    cache.locked_fund = 10
    batch = p.extend()
    assert cache.releases[0] == ["r1", "r2"]
    assert [e.req.rid for e in batch.entries][:1] == ["r0"]


def test_a_deferred_head_unlocks_everything_it_had_locked():
    cache = Cache(locked_fund=10, released_fund=10)
    reqs = [_req(f"r{i}", 30) for i in range(3)]
    p = _planner(cache, reqs)
    busy = _req("busy", 5)
    busy.phase = State.DECODE
    p.table.running.append(busy)
    assert p.extend() is None
    assert cache.releases == [["r1", "r2"], ["r0"]]
    assert [r.rid for r in p.table.waiting] == ["r0", "r1", "r2"] and cache.allocates == []
