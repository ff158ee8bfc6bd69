"""The gateway in front of two replicas (issue 11): two fake schedulers and a fake cache (ProbePrefix) on real gRPC
ports, the gateway on a real HTTP port. The cache's answer decides the ranking (r0 holds 20 tokens of every prompt
unless a test says otherwise), the load polls are off, so each test knows where a call goes."""

from __future__ import annotations

import time

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import gateway.replicas
from gateway.app import create_app
from gateway.replica_spec import ReplicaSpec
from gateway.replicas import ReplicaSet
from tests.gateway.conftest import N_POSITIONS, Gateway, make_settings
from tests.gateway.fake_cache import FakeCache, serve_cache
from tests.gateway.fake_scheduler import FakeScheduler, serve
from tests.gateway.helpers import complete, stream

PROMPT = "def add(a, b):\n    # add two numbers and return their sum, then test it well\n   "


@pytest.fixture(scope="module")
def servers(tokenizer):
    fakes = [FakeScheduler(tokenizer, N_POSITIONS), FakeScheduler(tokenizer, N_POSITIONS)]
    running = [serve(f) for f in fakes]
    cache = FakeCache()
    cache_server = serve_cache(cache)
    yield fakes, running, cache, cache_server
    for r in running + [cache_server]:
        r.server.stop(0)


@pytest.fixture
def two(servers, tokenizer):
    """(gateway factory, [fake0, fake1], cache); the factory takes scheduler addresses to override (a dead one)."""
    fakes, running, cache, cache_server = servers
    for f in fakes:
        f.reset()
    for r in running:
        r.set_serving(True)
    cache.reset()
    cache.cached = {"p0": 20}
    started: list[Gateway] = []

    def start(schedulers: list[str] | None = None, **overrides) -> Gateway:
        addrs = schedulers or [f"127.0.0.1:{r.port}" for r in running]
        specs = [ReplicaSpec(a, f"127.0.0.1:{cache_server.port}", f"p{i}") for i, a in enumerate(addrs)]
        replicas = ReplicaSet.build(specs, retry_after_s=1, probe_interval_s=0, probe_timeout_s=1.0,
                                    load_interval_s=0, unary_timeout_s=2.0)
        gw = Gateway(create_app(replicas, tokenizer, make_settings(**overrides)))
        started.append(gw)
        return gw

    yield start, fakes, cache
    for gw in started:
        gw.stop()


def samples(gw) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(f"{gw.url}/metrics", timeout=10).text):
        for s in family.samples:
            out[s.name + "".join(f"|{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")] = s.value
    return out


def test_a_call_goes_to_the_replica_holding_its_prefix_and_the_prediction_is_counted(two):
    start, (f0, f1), cache = two
    gw = start()
    f0.cached_tokens = 20
    r = complete(gw, prompt=PROMPT, max_tokens=3)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 20
    assert len(f0.requests) == 1 and f1.requests == []
    assert [list(p.pool_ids) for p in cache.requests] == [["p0", "p1"]]  # one probe for the one cache address
    s = samples(gw)
    assert s["codeserve:routed_requests_total|policy=cache_aware|replica=r0"] == 1
    assert s["codeserve:route_predictions_total|outcome=exact"] == 1
    assert s["codeserve:route_prediction_exact_share"] == 1.0
    cache.cached = {"p1": 20}  # the truth moved (r0 evicted it, r1 has it): the next call follows it
    assert complete(gw, prompt=PROMPT, max_tokens=3).status_code == 200
    assert len(f1.requests) == 1
    assert samples(gw)["codeserve:route_predictions_total|outcome=over"] == 1  # r1's fake realized 0


@pytest.mark.parametrize("code", [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE])
def test_a_call_refused_before_its_first_message_is_retried_once_on_the_next_best(two, code):
    start, (f0, f1), cache = two
    gw = start()
    f0.error = (code, "queue full" if code == grpc.StatusCode.RESOURCE_EXHAUSTED else "worker w0 not answering")
    r = complete(gw, prompt=PROMPT, max_tokens=3)
    assert r.status_code == 200, r.text
    assert len(f0.requests) == 1 and len(f1.requests) == 1
    assert f1.requests[0].request_id == f0.requests[0].request_id  # the same call, once more
    assert samples(gw)[f"codeserve:route_retries_total|code={code.name}|replica=r0"] == 1


def test_the_retry_happens_once(two):
    start, (f0, f1), cache = two
    gw = start()
    f0.error = f1.error = (grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
    r = complete(gw, prompt=PROMPT, max_tokens=3)
    assert r.status_code == 429 and "queue full" in r.json()["error"]["message"]
    assert len(f0.requests) == 1 and len(f1.requests) == 1


def test_no_retry_after_a_message_was_streamed_and_the_replica_is_excluded(two):
    start, (f0, f1), cache = two
    gw = start()
    f0.error_after_first_if = lambda request: (grpc.StatusCode.UNAVAILABLE, "worker w0 died")
    status, events = stream(gw, "/v1/completions", {"model": "test-model", "prompt": PROMPT, "max_tokens": 8,
                                                    "stream": True})
    assert status == 200
    assert "worker w0 died" in events[-2]["error"]["message"] and events[-1] == "[DONE]"
    assert f1.requests == []  # never retried once a message went out
    f0.error_after_first_if = None
    assert complete(gw, prompt=PROMPT, max_tokens=3).status_code == 200
    assert len(f0.requests) == 1 and len(f1.requests) == 1  # r0 (still cheapest by the cache) is excluded


def test_an_unreachable_replica_is_excluded_at_once_and_new_calls_go_elsewhere(two, servers):
    start, (f0, f1), cache = two
    gw = start([f"127.0.0.1:1", f"127.0.0.1:{servers[1][1].port}"])
    assert complete(gw, prompt=PROMPT, max_tokens=3).status_code == 200  # r0 refused the connection: retried on r1
    assert complete(gw, prompt=PROMPT, max_tokens=3).status_code == 200
    s = samples(gw)
    assert len(f1.requests) == 2
    assert s["codeserve:route_retries_total|code=UNAVAILABLE|replica=r0"] == 1  # only the first call tried r0
    assert s["codeserve:routed_requests_total|policy=cache_aware|replica=r0"] == 1
    assert s["codeserve:scheduler_up|replica=r0"] == 0 and s["codeserve:scheduler_up|replica=r1"] == 1
    ready = httpx.get(f"{gw.url}/ready", timeout=10)
    assert ready.status_code == 200
    assert [(e["replica"], e["state"]) for e in ready.json()["replicas"]] == [("r0", "unreachable"), ("r1", "ready")]


def test_all_replicas_down_is_a_503_naming_each(two):
    start, fakes, cache = two
    gw = start(["127.0.0.1:1", "127.0.0.1:2"])
    r = complete(gw, prompt=PROMPT, max_tokens=3)
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    ready = httpx.get(f"{gw.url}/ready", timeout=10)
    assert ready.status_code == 503 and ready.headers["Retry-After"] == "1"
    assert [e["state"] for e in ready.json()["replicas"]] == ["unreachable", "unreachable"]
    assert "no replica is ready" in ready.json()["error"]["message"]


def test_a_failed_cache_probe_routes_as_zero_cached_and_serves_the_call(two):
    start, (f0, f1), cache = two
    gw = start()
    cache.error = (grpc.StatusCode.UNAVAILABLE, "cache restarting")
    for _ in range(4):
        assert complete(gw, prompt=PROMPT, max_tokens=3).status_code == 200
    assert len(f0.requests) + len(f1.requests) == 4


def test_flush_server_info_and_metrics_cover_every_replica(two):
    start, (f0, f1), cache = two
    gw = start()
    flushed = httpx.post(f"{gw.url}/flush_cache", timeout=10).json()
    assert flushed["freed_tokens"] == 300 and [e["freed_tokens"] for e in flushed["replicas"]] == [150, 150]
    assert f0.flushes == 1 and f1.flushes == 1
    info = httpx.get(f"{gw.url}/server_info", timeout=10).json()
    assert info["load"]["running"] == 6 and info["load"]["waiting"] == 4  # totals: 3 + 3 running, 2 + 2 waiting
    assert [(e["replica"], e["pool"], e["load"]["running"]) for e in info["replicas"]] == [("r0", "p0", 3),
                                                                                           ("r1", "p1", 3)]
    assert len(info["pools"]) == 2 and info["routing"] == "cache_aware"
    s = samples(gw)
    assert s["vllm:num_requests_running"] == 6 and s["codeserve:replica_requests_running|replica=r1"] == 3
    assert s["vllm:prefix_cache_hits_total"] == 240 and s["codeserve:replica_prefix_cache_hits_total|replica=r0"] == 120
    assert abs(s["vllm:kv_cache_usage_perc"] - 0.25) < 1e-9
    assert s["vllm:request_success_total|finished_reason=length"] == 2  # each scheduler's one, merged
    assert s["vllm:time_to_first_token_seconds_count"] == 2


def test_server_info_names_each_replica_state_as_ready_does(two):
    """/server_info's per-replica ``state`` is one of /ready's names (ready, not_serving, unreachable, excluded,
    outage) with the sentence in ``reason``; it was the sentence itself for a replica that answered but was out of
    routing (``"state": "a call to r0 failed UNAVAILABLE: ..."``)."""
    start, (f0, f1), cache = two
    gw = start()
    f0.error_if = lambda request: (grpc.StatusCode.UNAVAILABLE, "worker w0 not answering")
    assert complete(gw, prompt=PROMPT, max_tokens=3).status_code == 200  # retried on r1; r0 excluded
    f0.error_if = None
    info = httpx.get(f"{gw.url}/server_info", timeout=10).json()
    r0, r1 = info["replicas"]
    assert (r0["state"], r1["state"]) == ("excluded", "ready")
    assert r0["reason"].startswith("a call to r0 failed UNAVAILABLE") and "reason" not in r1
    assert r0["load"]["running"] == 3  # it answered: its load and pools are there
    ready = httpx.get(f"{gw.url}/ready", timeout=10).json()
    assert [(e["state"], e.get("reason")) for e in ready["replicas"]] == [(r0["state"], r0["reason"]),
                                                                          ("ready", None)]


def test_a_replica_that_dies_mid_stream_ends_its_streams_with_an_error_naming_it(two, servers, tokenizer):
    start, (f0, f1), cache = two
    dying = FakeScheduler(tokenizer, N_POSITIONS)  # its own server: this test stops it
    dying.token_delay_s = 0.2
    dying_server = serve(dying)
    address = f"127.0.0.1:{dying_server.port}"
    try:
        gw = start([address, f"127.0.0.1:{servers[1][1].port}"])
        with httpx.stream("POST", f"{gw.url}/v1/completions", timeout=30,
                          json={"model": "test-model", "prompt": PROMPT, "max_tokens": 8, "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")  # the first chunk came from r0
            dying_server.server.stop(0)
            body = "\n".join(lines)
        assert address in body and "went away" in body and body.rstrip().endswith("data: [DONE]")
        assert complete(gw, prompt=PROMPT, max_tokens=3).status_code == 200
        assert len(f1.requests) == 1 and len(dying.requests) == 1  # r0 excluded at once: no retry needed
    finally:
        dying_server.server.stop(0)


def test_replica_flags():
    from gateway.__main__ import parse_args

    args = parse_args(["--model-path", "m", "--replica", "scheduler=h:1,cache=c:2,pool=p0",
                       "--replica", "scheduler=h:3,cache=c:2,pool=p1", "--routing", "least_load"])
    assert args.replicas == [ReplicaSpec("h:1", "c:2", "p0"), ReplicaSpec("h:3", "c:2", "p1")]
    assert args.routing == "least_load" and args.route_queued_weight == 1.0 and args.route_requests_weight == 16.0
    assert parse_args(["--model-path", "m"]).replicas == [ReplicaSpec("127.0.0.1:50053")]  # as before: one
    assert parse_args(["--model-path", "m", "--scheduler", "h:9"]).replicas == [ReplicaSpec("h:9")]
    assert ReplicaSpec.parse("scheduler=h:1,cache=c:2") == ReplicaSpec("h:1", "c:2", "default")
    for bad in (["--scheduler", "h:9", "--replica", "scheduler=h:1,cache=c:2"],
                ["--replica", "scheduler=h:1"], ["--replica", "scheduler=h:1,cache=c:2,colour=red"],
                ["--replica", "scheduler=h,cache=c:2"],
                ["--replica", "scheduler=h:99999,cache=c:2"], ["--replica", "scheduler=h:1,cache=c:0"],
                ["--replica", "scheduler=h:1,cache=c:2", "--replica", "scheduler=h:1,cache=c:2,pool=p2"],
                ["--routing", "random"], ["--pending-ttl", "0"]):
        with pytest.raises(SystemExit) as info:
            parse_args(["--model-path", "m", *bad])
        assert info.value.code == 2, bad


def test_without_a_health_probe_an_exclusion_lapses(two, monkeypatch):
    monkeypatch.setattr(gateway.replicas, "UNPROBED_EXCLUSION_S", 0.3)
    start, (f0, f1), cache = two
    gw = start()  # probe interval 0: nothing probes the schedulers
    f0.error = (grpc.StatusCode.UNAVAILABLE, "worker w0 not answering")
    assert complete(gw, prompt=PROMPT, max_tokens=3).status_code == 200  # retried on r1; r0 excluded
    f0.error = None
    assert complete(gw, prompt=PROMPT, max_tokens=3).status_code == 200
    assert (len(f0.requests), len(f1.requests)) == (1, 2)
    time.sleep(0.5)
    assert complete(gw, prompt=PROMPT, max_tokens=3).status_code == 200
    assert (len(f0.requests), len(f1.requests)) == (2, 2)  # r0 (holding the prefix) is routed again


def test_n_copies_of_one_prompt_go_to_one_replica(two):
    start, (f0, f1), cache = two
    gw = start()
    cache.cached = {}  # nothing cached anywhere: the first copy's replica is a tie
    r = complete(gw, prompt=PROMPT, max_tokens=3, n=3)
    assert r.status_code == 200 and len(r.json()["choices"]) == 3
    assert sorted([len(f0.requests), len(f1.requests)]) == [0, 3]  # the copies followed the first (pending)


def test_ready_and_health_generate_list_each_replica(two, servers):
    start, (f0, f1), cache = two
    gw = start([f"127.0.0.1:{servers[1][0].port}", "127.0.0.1:1"])
    health = httpx.get(f"{gw.url}/health_generate", timeout=30)
    assert health.status_code == 200
    assert [(e["replica"], e["state"]) for e in health.json()["replicas"]] == [("r0", "ok"), ("r1", "failed")]
    servers[1][0].set_serving(False)
    ready = httpx.get(f"{gw.url}/ready", timeout=10)
    assert ready.status_code == 503
    assert [(e["state"], e["reason"]) for e in ready.json()["replicas"]] == [
        ("not_serving", "NOT_SERVING"), ("unreachable", "no answer to its health check within 2.0 s: UNAVAILABLE")]
    f0.load.unhealthy_reason = "worker w0 has not answered health checks for 12.0 s"  # was: "NOT_SERVING" alone
    ready = httpx.get(f"{gw.url}/ready", timeout=10)
    assert ready.json()["replicas"][0]["reason"] == "NOT_SERVING: worker w0 has not answered health checks for 12.0 s"
