"""Admission arithmetic on hand-made cache Counters (the real proto message), and the policies."""

from dataclasses import dataclass

import pytest

from codeserve.v1 import cache_pb2
from scheduler_svc.admission import CLIP_MAX_NEW_TOKENS, Ledger, NewTokenRatio, fundable, future_tokens, reserved_for_running
from scheduler_svc.policy import order_waiting, retract_victim
from scheduler_svc.intake import Intake
from scheduler_svc.request import Params, Req
from scheduler_svc.requests import RequestTable


@dataclass
class Running:
    pending_tokens: int
    remaining_new_tokens: int


def counters(available=0, evictable=0, capacity=1000):
    return cache_pb2.Counters(capacity=capacity, available=available, evictable=evictable)


def test_fundable_counts_available_and_evictable():
    assert fundable(counters(available=10, evictable=100)) == 110


def test_running_requests_reserve_unwritten_prompt_plus_ratio_of_remaining_new_tokens():
    running = [Running(0, 100), Running(50, 100), Running(0, 10 * CLIP_MAX_NEW_TOKENS)]
    assert reserved_for_running(running, 0.5) == 50 + (50 + 50) + CLIP_MAX_NEW_TOKENS // 2
    assert future_tokens(3, 7, 0.5) == 3 + 4  # rounded up


def test_ledger_charges_every_admission_of_the_round():
    ledger = Ledger(reserved=100)
    c = counters(available=100, evictable=200)           # fundable 300, remaining 200
    first = ledger.decide(c, extend_tokens=100, remaining_new_tokens=100, ratio=0.5, pool_idle=False)
    assert first.admit and first.estimate == 150 and first.remaining == 200
    ledger.charge(first)
    second = ledger.decide(c, extend_tokens=100, remaining_new_tokens=100, ratio=0.5, pool_idle=False)
    assert not second.admit and second.charged == 150 and second.remaining == 50
    with pytest.raises(ValueError):
        ledger.charge(second)


def test_lock_that_takes_evictable_tokens_is_rechecked_on_the_receipt_after():
    ledger = Ledger(reserved=0)
    before_lock = counters(available=50, evictable=100)
    after_lock = counters(available=50, evictable=40)     # the matched prefix (60) is now protected
    assert ledger.decide(before_lock, 100, 0, 0.5, pool_idle=False).admit
    assert not ledger.decide(after_lock, 100, 0, 0.5, pool_idle=False).admit


def test_a_lone_request_needs_only_its_extend_to_fit():
    ledger = Ledger(reserved=0)
    c = counters(available=1000)
    d = ledger.decide(c, extend_tokens=500, remaining_new_tokens=4000, ratio=0.7, pool_idle=True)
    assert d.admit and d.cost == 500 and d.estimate == 500 + 2800
    ledger.charge(d)
    assert not ledger.decide(c, 10, 10, 0.7, pool_idle=True).admit  # no longer alone in this round
    assert not Ledger(0).decide(c, 1001, 0, 0.7, pool_idle=True).admit


def test_zero_budget_admits_nothing_but_is_a_number():
    d = Ledger(0).decide(counters(), 1, 0, 0.7, pool_idle=True)
    assert not d.admit and d.fundable == 0


def test_new_token_ratio_decays_to_its_floor_and_a_retract_raises_it():
    r = NewTokenRatio(init=0.7, floor=0.1, decay_steps=6)
    for _ in range(10):
        r.on_decode_step()
    assert r.value == pytest.approx(0.1)
    r.on_retract()
    assert r.value == pytest.approx(0.7)
    r.on_retract()
    assert r.value == pytest.approx(1.0)
    with pytest.raises(ValueError):
        NewTokenRatio(init=0.05, floor=0.1)


def make_req(rid, n_out=0):
    from codeserve.v1 import common_pb2

    req = Req(rid=rid, prompt_ids=[1, 2, 3], params=Params(max_new_tokens=10, asked_max_new_tokens=10,
                                                           sampling=common_pb2.SamplingParams()))
    req.output_ids = [5] * n_out
    return req


def test_lpm_orders_by_cached_prefix_and_keeps_retried_requests_first():
    a, b, c, d = (make_req(x) for x in "abcd")
    d.retractions = 1
    lengths = {"a": 0, "b": 30, "c": 30}
    order = order_waiting([a, b, c, d], "lpm", lambda reqs: [lengths[r.rid] for r in reqs])
    assert [r.rid for r in order] == ["d", "b", "c", "a"]
    assert [r.rid for r in order_waiting([a, b, c, d], "fcfs", None)] == ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match="unknown policy"):
        order_waiting([a], "random", None)


def test_retract_victim_has_fewest_output_tokens_then_latest_admission():
    a, b, c = make_req("a", 5), make_req("b", 2), make_req("c", 2)
    table = RequestTable(None, None, Intake(8), None)  # admit calls neither the cache nor the worker
    table.waiting.extend([a, b, c])
    for r in (a, b, c):
        table.admit(r, 0, [])
    assert retract_victim([a, b, c]).rid == "c"
    with pytest.raises(ValueError):
        retract_victim([])
