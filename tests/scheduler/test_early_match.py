"""Early Match (``scheduler_svc/early_match.py``): an arrival's locking Match is sent by the thread that accepts it,
and the loop admits on its receipt. On the real cache service (a real gRPC server and CacheClient): the admission
uses the early receipt and sends no Match of its own; an early receipt only says yes (a no is judged again on the
loop's own Match); a waiting request aborted, behind a head that does not fit, or in the way of a running
request's decode Allocate lets its early registration go (nothing leaked, nothing retracted or failed); a receipt
of an older session is dropped, and none is sent before the pool's registration is answered; an id whose end is
still deferred at the cache is not matched early; lpm and the flag turn it off. End to end through the loop:
tests/scheduler/test_admission_round_trip.py, tests/test_hop_trace.py and the editor burst tests."""

from __future__ import annotations

import contextlib
import threading

import pytest
import structlog

from codeserve.v1 import cache_pb2, common_pb2
from scheduler_svc.admission import NewTokenRatio
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.early_match import MAX_WAITING, EarlyMatch
from scheduler_svc.errors import DependencyUnavailable
from scheduler_svc.intake import Intake
from scheduler_svc.planner import Planner
from scheduler_svc.request import Params, Req, State
from scheduler_svc.requests import RequestTable
from scheduler_svc.stats import Stats
from tests.scheduler.cache_service import cache_service

CAPACITY = 256


class Parts:
    """The loop's parts on a real cache service: intake, table, early, planner (no worker: nothing is sent)."""

    def __init__(self, cache, cfg: SchedulerConfig) -> None:
        self.cache, self.cfg = cache, cfg
        self.intake = Intake(64)
        self.early = EarlyMatch(cache, settings=lambda: self.cfg, waiting=lambda: self.table.snapshot[1])
        self.table = RequestTable(cache, None, self.intake, structlog.get_logger(), early=self.early)
        self.stats = Stats()
        self.planner = Planner(self.table, cache, cfg, NewTokenRatio(), self.stats, structlog.get_logger(),
                               early=self.early)

    def submit(self, req: Req) -> Req:
        self.early.submit(req, lambda on_accept: self.intake.submit(req, self.table.snapshot[1], on_accept))
        return req

    def counters(self) -> cache_pb2.Counters:
        self.cache.flush_deferred()
        return self.cache.get_pool().counters


@contextlib.contextmanager
def parts(**cfg):
    with cache_service() as (core, cache):
        cache.open_session("t", 30.0)
        cache.register_pool(1, [cache_pb2.PoolMember(worker_id="w", epoch="e", capacity_tokens=CAPACITY)])
        yield Parts(cache, SchedulerConfig(**cfg)), core


def _req(rid: str, prompt: list[int], max_new: int = 4) -> Req:
    req = Req(rid=rid, prompt_ids=list(prompt), params=Params(
        max_new_tokens=max_new, asked_max_new_tokens=max_new, sampling=common_pb2.SamplingParams(), ignore_eos=True))
    req.stream = Stream()
    return req


class Stream:
    """What the table calls on an aborted request's stream."""

    def finish_without_token(self, finish) -> None:
        self.finish = finish

    def close(self) -> None:
        pass

    def fail(self, code, message) -> None:  # a refused request
        self.failed = (code, message)


def _calls(cache) -> list[str]:
    from tests.scheduler.test_deferred_cache_ops import cache_calls

    return cache_calls(type("S", (), {"cache": cache})())


def test_admission_decides_on_the_early_receipt_and_sends_no_match_of_its_own():
    with parts(chunk_size=64) as (p, core):
        calls = _calls(p.cache)
        a = p.submit(_req("a", range(10, 47)))  # 37 tokens, not a page multiple
        assert a.early is not None and calls == ["Match"]  # sent on accept, before the loop took it
        p.table.take_new()
        batch = p.planner.extend()
        assert calls == ["Match"], calls  # no loop Match, no Allocate: the early one allocated the chunk
        assert [(e.req.rid, e.start, e.n, len(e.slot_ids)) for e in batch.entries] == [("a", 0, 37, 37)]
        assert a.state == State.PREFILL and a.early is None
        assert p.stats.counts["admissions_early_matched"] == 1
        assert p.counters().available == CAPACITY - 37


def test_a_waiting_request_aborted_lets_its_early_registration_go():
    with parts(chunk_size=64, max_running_requests=1) as (p, core):
        a = p.submit(_req("a", range(10, 47)))
        p.table.take_new()
        p.planner.extend()  # a runs: the only room
        b = p.submit(_req("b", range(50, 80)))  # matched early, waits (no room)
        p.table.take_new()
        assert p.planner.extend(new_only=True) is None and b.early is not None  # a's chunk is in flight
        b.early.future.result()  # the early Match is in before the pool is read
        assert p.counters().available == CAPACITY - 37 - 30  # b's first chunk is held while it waits
        p.intake.abort("b", "client")
        p.table.abort()
        assert b.state == State.WAITING and not p.table.waiting and b.early is None
        assert p.counters().available == CAPACITY - 37  # b's registration went with its abort (was leaked)
        assert core.check_integrity("default") == []
        assert a.state == State.PREFILL


def test_a_head_that_does_not_fit_is_judged_again_without_the_early_locks_behind_it():
    # the head (a retracted request, first in line) needs more than the free pages once the two arrivals behind it
    # hold their first chunks; their registrations are let go and the head is admitted on the release's counters
    with parts(chunk_size=200) as (p, core):
        b = p.submit(_req("b", range(1000, 1100)))
        c = p.submit(_req("c", range(2000, 2100)))
        assert b.early is not None and c.early is not None
        head = _req("head", range(3000, 3180), max_new=1)
        p.table.take_new()
        p.table.waiting.appendleft(head)
        batch = p.planner.extend()
        assert batch is not None and batch.entries[0].req is head, batch
        assert b.early is None and c.early is None  # settled and released: matched again by the loop later
        assert {r.rid for r in p.table.running} >= {"head"}
        assert core.check_integrity("default") == []


def test_a_receipt_of_an_older_session_is_dropped_and_the_loop_matches_again():
    with parts(chunk_size=64) as (p, core):
        a = p.submit(_req("a", range(10, 47)))
        a.early.future.result()
        p.cache.open_session("t", 30.0)  # a resync: the cache released the old session's requests
        p.cache.register_pool(1, [cache_pb2.PoolMember(worker_id="w", epoch="e", capacity_tokens=CAPACITY)])
        calls = _calls(p.cache)
        p.table.take_new()
        batch = p.planner.extend()
        assert [e.req.rid for e in batch.entries] == ["a"] and calls == ["Match"]  # the loop's own
        assert p.stats.counts["admissions_early_matched"] == 0


def test_an_id_whose_end_is_deferred_is_not_matched_early():
    with parts(chunk_size=64) as (p, core):
        p.submit(_req("x", range(10, 47)))
        p.table.take_new()
        p.planner.extend()
        p.intake.abort("x", "client")
        p.table.abort()  # x ended mid-prefill: its release rides the next cache call
        again = p.submit(_req("x", range(10, 47)))  # the id is free again at the intake, not yet at the cache
        assert again.early is None  # an early Match would reach the cache before that release: registered twice
        p.intake.abort("x", "client")
        p.table.take_new()
        p.table.abort()
        p.cache.flush_deferred()
        assert p.submit(_req("x", range(10, 47))).early is not None
        p.intake.abort("x", "client")
        p.table.take_new()
        p.table.abort()
        assert p.counters().available == CAPACITY and core.check_integrity("default") == []


@pytest.mark.parametrize("cfg", [dict(policy="lpm"), dict(early_match=False)])
def test_lpm_and_the_flag_turn_it_off(cfg):
    with parts(**cfg) as (p, core):
        assert p.submit(_req("a", range(10, 47))).early is None


def test_a_queue_of_waiting_requests_is_matched_by_the_loop():
    with parts(chunk_size=64) as (p, core):
        reqs = [p.submit(_req(f"r{i}", range(100 * i + 1, 100 * i + 20))) for i in range(MAX_WAITING + 2)]
        assert [r.early is not None for r in reqs] == [True] * MAX_WAITING + [False, False]


def test_an_early_no_is_judged_again_on_the_loops_own_match():
    # the early receipt of a saw 56 free tokens: r held the rest. r was aborted before the loop reached a: its release
    # is deferred (it rides the loop's next cache call), so a's receipt is stale. Refusing a on it ("an idle pool
    # funds only 56") would fail a request that the now idle pool funds (it did before this test)
    with parts(chunk_size=256) as (p, core):
        r = p.submit(_req("r", range(1000, 1200)))
        p.table.take_new()
        p.planner.extend()
        a = p.submit(_req("a", range(10, 110)))
        a.early.future.result()
        p.intake.abort("r", "client")
        p.table.abort()  # r ends mid-prefill: released with the next cache call
        p.table.take_new()
        batch = p.planner.extend()
        assert not hasattr(a.stream, "failed"), a.stream.failed
        assert batch is not None and [e.req.rid for e in batch.entries] == ["a"] and a.state == State.PREFILL
        assert p.stats.counts["admissions_early_matched"] == 1  # r; a was admitted on the loop's Match
        assert r not in p.table.running
        assert core.check_integrity("default") == []


def test_a_decode_allocation_lets_waiting_early_chunks_go_before_failing_a_running_request():
    with parts(chunk_size=256, max_running_requests=1) as (p, core):
        r = p.submit(_req("r", range(10, 70), max_new=8))
        p.table.take_new()
        p.planner.extend()
        r.kv_len, r.phase = 60, State.DECODE  # its prefill ran
        b = p.submit(_req("b", range(1000, 1196)))  # waits (no room); its early Match takes every free slot
        b.early.future.result()
        p.table.take_new()
        assert p.counters().available == 0
        batch = p.planner.decode()
        assert batch is not None and [e.req.rid for e in batch.entries] == ["r"]  # was: r failed, "pool too small"
        assert r in p.table.running and b.early is None and list(p.table.waiting) == [b]
        assert p.counters().available == CAPACITY - 61
        assert core.check_integrity("default") == []


def test_no_early_match_before_the_pool_is_registered_in_the_session():
    with parts() as (p, core):
        p.cache.open_session("t", 30.0)  # a resync: its RegisterPool may flush the pool
        assert p.submit(_req("a", range(10, 47))).early is None
        p.cache.register_pool(1, [cache_pb2.PoolMember(worker_id="w", epoch="e", capacity_tokens=CAPACITY)])
        assert p.submit(_req("b", range(10, 47))).early is not None


def test_the_match_is_sent_after_the_intake_lock_and_the_loop_waits_for_the_send():
    # claimed under the intake's lock (the loop may take the request at once), sent after it: the loop's reply waits
    # for the send instead of reading an early Match that is not out yet
    with parts(chunk_size=64) as (p, core):
        a = _req("a", range(10, 47))
        request = p.early.prepare(a)
        held = []
        p.intake.submit(a, 0, lambda r, inbox: held.append(p.early.claim(r, request, inbox)))
        assert a.early is held[0] and not a.early.sent.is_set()
        sender = threading.Timer(0.2, p.early.send, (a, held[0]))
        sender.start()
        p.table.take_new()
        batch = p.planner.extend()  # waits for the send, then admits on the early receipt
        sender.join()
        assert [e.req.rid for e in batch.entries] == ["a"] and p.stats.counts["admissions_early_matched"] == 1


def test_a_send_that_failed_is_a_cache_failure_in_the_loop_not_in_the_servicer():
    with parts(chunk_size=64) as (p, core):
        def closed(request):
            raise ValueError("Cannot invoke RPC on closed channel!")

        p.cache.match_early = closed
        p.submit(_req("a", range(10, 47)))  # accepted and queued: the servicer does not fail the call
        p.table.take_new()
        with pytest.raises(DependencyUnavailable, match="was not sent"):  # the loop resyncs, as for a failed call
            p.planner.extend()
