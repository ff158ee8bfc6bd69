"""The mutations the loop does not wait on (caching finished and aborted requests, prompts made visible at prefill,
releases) ride ahead of its next cache call in one Cache.Batch, so they cost no round trip of their own: over
requests that finish and are aborted, the loop sends no CacheRequests or ReleaseRequests RPC, the next request's
Match still finds what the finished one cached, and the pool is settled when the loop idles."""

from __future__ import annotations

from tests.scheduler.test_liveness import TOKEN, assert_pool_clean, ending, frozen_loop, wait_until  # noqa: F401


def cache_calls(sched) -> list[str]:
    """The names of the cache RPCs ``sched``'s cache client sends from now on, in order (a list that grows; an
    early Match, sent by a servicer thread, is "Match" too)."""
    calls: list[str] = []
    original, original_early = sched.cache._call, sched.cache.match_early

    def counted(name, request, *args, **kwargs):
        calls.append(name)
        return original(name, request, *args, **kwargs)

    def counted_early(request):
        calls.append("Match")
        return original_early(request)

    sched.cache._call = counted
    sched.cache.match_early = counted_early
    return calls


def test_finishes_and_aborts_send_no_cache_rpc_of_their_own(frozen_loop) -> None:
    sched, worker, clock, liveness, submit, core = frozen_loop(overlap=True)
    calls = cache_calls(sched)
    prompt = list(range(40, 80))
    a = submit("a", 3, prompt)
    tokens, end = ending(a)
    assert tokens == [TOKEN] * 3 and end.code is None
    b = submit("b", 100_000, prompt + [1, 2])  # shares a's prompt: cached by a's deferred finish
    wait_until(lambda: b.kv_len > 0, "b prefilled")
    assert b.cached_tokens >= len(prompt) - 1
    sched.abort("b")
    tokens, end = ending(b)
    wait_until(lambda: sched.queue_lengths()[:2] == (0, 0), "idle")
    assert "CacheRequests" not in calls and "ReleaseRequests" not in calls, calls
    assert "Batch" in calls
    assert_pool_clean(sched, core)


def test_a_flush_goes_after_what_was_deferred_before_it() -> None:
    """CacheClient.flush (the FlushCache RPC's, from a servicer thread) sends the deferred operations first: a
    request answered before the flush (its finish insert deferred) is flushed with the rest, deterministically."""
    from codeserve.v1 import cache_pb2
    from tests.scheduler.cache_service import cache_service

    with cache_service() as (core, cache):
        cache.open_session("scheduler-test", 30.0)
        cache.register_pool(1, [cache_pb2.PoolMember(worker_id="w", epoch="e", capacity_tokens=64)])
        tokens = list(range(5, 15))
        cache.match([cache_pb2.MatchItem(request_id="a", token_ids=tokens, lock=True, max_match_tokens=9)])
        cache.allocate([("a", len(tokens))])
        cache.defer_cache([cache_pb2.CacheItem(request_id="a", token_ids=tokens, finished=True)])
        assert cache.deferred_ends == 1
        cache.flush()
        counters = cache.get_pool().counters
        assert counters.available == counters.capacity == 64, counters  # inserted, then flushed: nothing left
        assert cache.deferred_ends == 0 and core.check_integrity("default") == []
