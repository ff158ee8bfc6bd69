"""A lone arrival is admitted in one cache round trip: its Match also allocates its first chunk (the loop sends no
Allocate for it), the decision is still taken on the counters after the lock, and nothing is left held."""

from __future__ import annotations

from tests.scheduler.test_deferred_cache_ops import cache_calls
from tests.scheduler.test_liveness import TOKEN, assert_pool_clean, ending, frozen_loop  # noqa: F401


def test_a_lone_admission_costs_one_cache_call(frozen_loop) -> None:
    sched, worker, clock, liveness, submit, core = frozen_loop(overlap=True)
    calls = cache_calls(sched)
    a = submit("a", 1, list(range(40, 77)))  # 37 tokens: not a page multiple, one chunk, no decode step
    tokens, end = ending(a)
    assert tokens == [TOKEN] and end.code is None
    assert "Match" in calls and "Allocate" not in calls, calls  # was: Match, then Allocate
    assert sched.stats["admissions_allocated_by_match"] == 1
    b = submit("b", 3, list(range(40, 77)) + [5, 6])  # shares a's prompt (cached by a's finish): a short extend
    tokens, end = ending(b)
    assert tokens == [TOKEN] * 3 and end.code is None
    assert sched.stats["admissions_allocated_by_match"] == 2
    assert_pool_clean(sched, core)
