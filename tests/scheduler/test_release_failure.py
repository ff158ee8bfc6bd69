"""A dependency call that fails while finished requests are being released (the idle loop's worker Release of
the releases no Forward carried, or the cache call that carries their deferred CacheRequests, raising
DependencyUnavailable, e.g. DEADLINE_EXCEEDED at a worker that froze just then) must not
lose them: each still gets its complete answer, the scheduler is idle afterwards (no request kept 'in flight'
forever, so the progress watchdog does not turn NOT_SERVING on an idle server), the resync releases them at the
worker, and the pool is clean. Found by a fresh-user review (a client hung for 120 s and /ready stayed 503)."""

from __future__ import annotations

import pytest

from scheduler_svc.errors import DependencyUnavailable
from tests.scheduler.test_liveness import TOKEN, assert_pool_clean, ending, frozen_loop, wait_until  # noqa: F401


@pytest.mark.parametrize("failing", ["worker.release", "cache.Batch"])
@pytest.mark.parametrize("overlap", [False, True])
def test_a_failed_release_of_finished_requests_still_answers_them_and_leaves_nothing_behind(
        frozen_loop, overlap, failing):
    """``cache.Batch``: the call that carries the finished request's deferred CacheRequests (the next Allocate,
    or the flush before the loop idles) fails."""
    sched, worker, clock, liveness, submit, core = frozen_loop(overlap=overlap)
    owner = worker if failing == "worker.release" else sched.cache
    name = "release" if owner is worker else "_call"
    original = getattr(owner, name)
    failures = []

    def fails_once(*args, **kwargs):
        carries_finish = owner is worker or (args[0] == "Batch" and any(
            i.finished for o in args[1].ops if o.HasField("cache") for i in o.cache.items))
        if not failures and carries_finish:
            failures.append(args)
            raise DependencyUnavailable("worker" if owner is worker else "cache", "127.0.0.1:1",
                                        f"{name}: DEADLINE_EXCEEDED (test)")
        return original(*args, **kwargs)

    setattr(owner, name, fails_once)
    a = submit("a", 3)
    tokens, end = ending(a)
    wait_until(lambda: bool(failures), f"{failing} called")  # both come after a's answer (idle flush, next call)
    assert tokens == [TOKEN] * 3 and end.code is None, (tokens, end)  # its complete answer, no error
    wait_until(lambda: not sched.intake.busy(), "the scheduler forgets the finished request")
    b = submit("b", 2)  # served after the resync
    tokens, end = ending(b)
    assert tokens == [TOKEN] * 2 and end.code is None, (tokens, end)
    released = lambda: [rid for e in worker.events if e[0] == "release" for rid in e[1]]  # noqa: E731
    # "a" by the resync, "b" by the idle loop's flush (after its stream ended) or on a Forward
    wait_until(lambda: "a" in released() and "b" in released(), f"a and b released at the worker: {worker.events}")
    assert_pool_clean(sched, core)
    assert not sched.intake.busy()
