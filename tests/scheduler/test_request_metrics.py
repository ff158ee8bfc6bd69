"""Issue 12: the scheduler counts each request once. Prefix-cache counters count each prompt once, at its first
admission (not per admission attempt, not a retracted request's recompute), and agree with the cached_tokens
the answers report; every Generate call is counted exactly once in the request metrics (GetLoad's text)."""

import random
import threading
import time

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from codeserve.v1 import scheduler_pb2
from tests.stack import Backend, generate, generate_many, request, status_of

CAPACITY = 2048


@pytest.fixture(scope="module")
def small(tmp_path_factory, model_path):
    with Backend.start(tmp_path_factory.mktemp("metrics-logs"), model_path=model_path, kv_tokens=CAPACITY,
                       chunk_size=256, max_running_requests=16) as be:
        yield be


def events(be: Backend, name: str) -> int:
    return be.stack.log_tail("scheduler", 200000).count(f'"event": "{name}"')


def request_metrics(be: Backend) -> dict[str, float]:
    """The scheduler's request metrics as {"name|label=value": value}."""
    text = be.scheduler.GetLoad(scheduler_pb2.GetLoadRequest(request_metrics=True), timeout=10).request_metrics
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name + "".join(f"|{k}={v}" for k, v in sorted(s.labels.items()))] = s.value
    return out


def delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def distinct_prompts(rng: random.Random, count: int, length: int) -> list[list[int]]:
    """Prompts of ids in [100, 1024) with no two sharing a first token (no prefix in common)."""
    firsts = rng.sample(range(100, 1024), count)
    return [[f] + [rng.randrange(100, 1024) for _ in range(length - 1)] for f in firsts]


def test_prefix_counters_count_each_prompt_once_under_deferral_and_retract(small):
    """Was: queries rose by ~100x the prompt tokens sent (every deferred admission attempt and every retracted
    request's recompute of prompt + output counted, the recompute also as hits of its own cached prefix)."""
    small.idle_check()
    rng = random.Random(12)
    prompts = distinct_prompts(rng, 16, 100)
    before, retracted = small.load(), events(small, "retracted")
    outs = generate_many(small.scheduler, [dict(input_ids=p, max_new_tokens=400, ignore_eos=True) for p in prompts])
    after = small.load()
    assert events(small, "retracted") > retracted, "the pool was meant to force retracts"
    assert after.prefix_query_tokens - before.prefix_query_tokens == 16 * 100
    assert after.prefix_hit_tokens - before.prefix_hit_tokens == sum(o.cached_tokens for o in outs)
    small.idle_check()


def test_prefix_counters_count_a_deferred_request_once(small):
    """The issue's first case, scaled to this pool: two requests wait behind a long one that holds the pool
    (their admission is deferred round after round); was: every deferred attempt counted its prompt again."""
    small.idle_check()
    rng = random.Random(13)
    long, short_a, short_b = distinct_prompts(rng, 3, 1500)
    before = small.load()
    outs: list = [None, None, None]

    def run(i, ids, n):
        outs[i] = generate(small.scheduler, input_ids=ids, max_new_tokens=n, ignore_eos=True)

    threads = [threading.Thread(target=run, args=(0, long, 500))]
    threads[0].start()
    time.sleep(0.5)
    threads += [threading.Thread(target=run, args=(i, p[:300], 16)) for i, p in ((1, short_a), (2, short_b))]
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join()
    after = small.load()
    assert after.prefix_query_tokens - before.prefix_query_tokens == 1500 + 2 * 300
    assert after.prefix_hit_tokens - before.prefix_hit_tokens == sum(o.cached_tokens for o in outs)
    small.idle_check()


def test_prefix_hits_equal_reported_cached_tokens(small):
    small.idle_check()
    rng = random.Random(5)
    prefix = distinct_prompts(rng, 1, 300)[0]
    generate(small.scheduler, input_ids=prefix, max_new_tokens=2, ignore_eos=True)  # caches the prefix
    before = small.load()
    prompts = [prefix + [rng.randrange(100, 1024) for _ in range(20)] for _ in range(3)]
    outs = generate_many(small.scheduler, [dict(input_ids=p, max_new_tokens=4, ignore_eos=True) for p in prompts])
    after = small.load()
    assert all(o.cached_tokens >= 299 for o in outs)
    assert after.prefix_query_tokens - before.prefix_query_tokens == 3 * 320
    assert after.prefix_hit_tokens - before.prefix_hit_tokens == sum(o.cached_tokens for o in outs)
    small.idle_check()


def test_every_grpc_call_is_counted_once(small):
    """Was: the request metrics lived in the gateway only, so calls to the public gRPC API counted nowhere."""
    small.idle_check()
    before = request_metrics(small)
    generate(small.scheduler, input_ids=[5, 6, 7], max_new_tokens=3, ignore_eos=True)  # length
    generate(small.scheduler, input_ids=[5, 6, 7], max_new_tokens=8)  # stop or length, whichever comes first
    code, _ = status_of(lambda: generate(small.scheduler, input_ids=[], max_new_tokens=3))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    call = small.scheduler.Generate(request(input_ids=[9, 10, 11], max_new_tokens=400, ignore_eos=True), timeout=60)
    next(iter(call))  # a first token, then the client goes away
    call.cancel()
    deadline = time.monotonic() + 10
    while delta(request_metrics(small), before, "vllm:request_success_total|finished_reason=abort") < 1:
        assert time.monotonic() < deadline, "the cancelled call was not counted"
        time.sleep(0.05)
    after = request_metrics(small)
    finished = sum(delta(after, before, f"vllm:request_success_total|finished_reason={r}")
                   for r in ("stop", "length", "abort"))
    assert finished == 3
    assert delta(after, before, "vllm:request_success_total|finished_reason=abort") == 1
    assert delta(after, before, "codeserve:generate_errors_total|code=INVALID_ARGUMENT") == 1
    assert delta(after, before, "vllm:e2e_request_latency_seconds_count") == 3
    assert delta(after, before, "vllm:time_to_first_token_seconds_count") == 3
    assert delta(after, before, "vllm:inter_token_latency_seconds_count") >= 2  # the first call's later tokens
    small.idle_check()


def test_concurrent_calls_each_counted_once(small):
    small.idle_check()
    before = request_metrics(small)
    rng = random.Random(7)
    prompts = distinct_prompts(rng, 8, 20)
    generate_many(small.scheduler, [dict(input_ids=p, max_new_tokens=5, ignore_eos=True) for p in prompts])
    errors: list[grpc.StatusCode] = []
    threads = [threading.Thread(target=lambda: errors.append(status_of(
        lambda: generate(small.scheduler, input_ids=[1] * 5000, max_new_tokens=1))[0])) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = request_metrics(small)
    assert delta(after, before, "vllm:request_success_total|finished_reason=length") == 8
    assert delta(after, before, "vllm:e2e_request_latency_seconds_count") == 8
    assert sum(delta(after, before, k) for k in after if k.startswith("codeserve:generate_errors_total")) == 2
    assert errors == [grpc.StatusCode.INVALID_ARGUMENT] * 2
    small.idle_check()


def test_a_health_probe_is_kept_out_of_the_request_metrics_and_token_counters(small):
    """The gateway's /health_generate marks its one-token generation (GenerateRequest.health_probe); was: counted
    as a user request (request_success, TTFT, e2e, prompt / generation / prefix-cache tokens)."""
    small.idle_check()
    before, load_before = request_metrics(small), small.load()
    out = generate(small.scheduler, input_ids=[5, 6, 7, 8], max_new_tokens=1, health_probe=True)
    assert len(out.token_ids) == 1 and out.finish_reason == "length"  # it is served all the same
    after, load_after = request_metrics(small), small.load()
    assert {k: v for k, v in after.items() if not k.endswith("_created")} == \
        {k: v for k, v in before.items() if not k.endswith("_created")}
    for field in ("prompt_tokens_total", "generation_tokens_total", "prefix_query_tokens", "prefix_hit_tokens"):
        assert getattr(load_after, field) == getattr(load_before, field), field
    generate(small.scheduler, input_ids=[5, 6, 7, 8], max_new_tokens=1)  # the same request unmarked is counted
    assert delta(request_metrics(small), after, "vllm:request_success_total|finished_reason=length") == 1
    assert small.load().generation_tokens_total == load_after.generation_tokens_total + 1
    small.idle_check()


def test_request_metrics_do_not_depend_on_the_cache_answering(small):
    """kill -STOP the cache: GetLoad still answers, at once, with the request metrics and the queue, and names the
    pool's failure in pool_error. Was: GetLoad aborted UNAVAILABLE after the cache's deadline, and the gateway's
    /metrics dropped every scheduler family (scheduler_up 0 though the scheduler was up)."""
    import signal

    small.idle_check()
    generate(small.scheduler, input_ids=[5, 6, 7], max_new_tokens=2, ignore_eos=True)
    small.wait_idle()  # its release at the cache (sent after its answer) is done: the queue reads 0 below
    small.stack.kill("cache", signal.SIGSTOP)
    try:
        started = time.monotonic()
        load = small.scheduler.GetLoad(scheduler_pb2.GetLoadRequest(request_metrics=True), timeout=5)
        took = time.monotonic() - started
    finally:
        small.stack.kill("cache", signal.SIGCONT)
    assert took < 3.0, took
    assert load.pool_error and "cache" in load.pool_error, load.pool_error
    assert list(load.pools) == []
    assert "vllm:request_success_total" in load.request_metrics
    assert load.running == 0 and load.waiting == 0
    deadline = time.monotonic() + 30
    while small.load().pool_error:  # the cache answers again
        assert time.monotonic() < deadline, small.load().pool_error
        time.sleep(0.1)
    small.idle_check()


def test_a_sibling_abort_is_counted_apart_from_client_aborts(small):
    """The gateway's Abort with sibling_failed, then its cancel: counted as finished_reason "abort" and in
    codeserve:sibling_aborts; a plain cancel (a client that left) only as "abort". Was: both the same."""
    small.idle_check()
    before = request_metrics(small)
    for sibling in (True, False):
        rid = f"fanout-{sibling}"
        call = small.scheduler.Generate(request(input_ids=[9, 10, 11], max_new_tokens=400, ignore_eos=True,
                                                request_id=rid), timeout=60)
        next(iter(call))  # it runs
        if sibling:
            assert small.scheduler.Abort(scheduler_pb2.AbortRequest(request_id=rid, sibling_failed=True),
                                         timeout=10).found
        call.cancel()
    deadline = time.monotonic() + 10
    while delta(request_metrics(small), before, "vllm:request_success_total|finished_reason=abort") < 2:
        assert time.monotonic() < deadline, "the calls were not counted"
        time.sleep(0.05)
    after = request_metrics(small)
    assert delta(after, before, "vllm:request_success_total|finished_reason=abort") == 2
    assert delta(after, before, "codeserve:sibling_aborts_total") == 1
    small.idle_check()
