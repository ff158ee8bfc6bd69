"""/health, /health_generate, /server_info, /flush_cache and /metrics."""

from __future__ import annotations

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.conftest import MODEL_NAME
from tests.gateway.helpers import complete
from tests.gateway.test_errors import assert_error


def test_health_is_liveness_only(start_gateway, fake):
    gw = start_gateway(target="127.0.0.1:1")
    assert httpx.get(f"{gw.url}/health").json() == {"status": "ok"}


def test_health_generate_does_a_one_token_round_trip(gateway, fake):
    r = httpx.get(f"{gateway.url}/health_generate")
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == 1
    sent = fake.requests[-1]
    assert sent.max_new_tokens == 1 and len(sent.input_ids.ids) > 0
    assert sent.health_probe  # the scheduler keeps it out of the request metrics (was: counted as a user request)


def test_health_generate_503_when_scheduler_is_down(start_gateway, fake):
    gw = start_gateway(target="127.0.0.1:1")
    r = httpx.get(f"{gw.url}/health_generate", timeout=30)
    assert_error(r, 503)
    assert r.headers["Retry-After"] == "1"


def test_health_generate_503_when_scheduler_is_stuck(start_gateway, fake):
    gw = start_gateway(health_timeout_s=0.5)
    fake.hang = True
    r = httpx.get(f"{gw.url}/health_generate", timeout=30)
    assert_error(r, 503, "0.5")
    fake.hang = False
    assert httpx.get(f"{gw.url}/health_generate", timeout=30).status_code == 200


def test_health_generate_503_when_scheduler_not_serving(gateway, fake_server, fake):
    fake_server[1].set_serving(False)
    assert_error(httpx.get(f"{gateway.url}/health_generate"), 503, "NOT_SERVING")
    fake.load.unhealthy_reason = "no batch completed for 31 s (progress timeout 30 s) while work waits or runs"
    assert_error(httpx.get(f"{gateway.url}/health_generate"), 503, "NOT_SERVING: no batch completed for 31 s")
    assert fake.requests == []  # no generation was attempted


def test_health_generate_503_when_generation_fails(gateway, fake):
    import grpc

    fake.error = (grpc.StatusCode.INTERNAL, "worker died")
    assert_error(httpx.get(f"{gateway.url}/health_generate"), 503, "worker died")


def test_server_info(gateway, fake):
    body = httpx.get(f"{gateway.url}/server_info").json()
    assert body["model_name"] == MODEL_NAME
    assert body["n_positions"] == fake.n_positions
    assert body["max_running_requests"] == 8 and body["chunk_size"] == 32 and body["page_size"] == 1
    assert body["pools"] == [{"pool_id": "default", "capacity": 1000, "available": 600, "evictable": 150,
                              "protected": 50, "owned": 200}]
    assert body["load"]["running"] == 3 and body["load"]["waiting"] == 2
    assert body["gateway_limits"]["max_n"] == 16


def test_server_info_503_when_scheduler_down(start_gateway, fake):
    gw = start_gateway(target="127.0.0.1:1")
    assert_error(httpx.get(f"{gw.url}/server_info", timeout=30), 503)


def test_flush_cache(gateway, fake):
    r = httpx.post(f"{gateway.url}/flush_cache")
    assert r.json() == {"freed_tokens": 150}
    assert fake.flushes == 1


def _samples(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + "".join(f"|{k}={v}" for k, v in sorted(sample.labels.items()) if k != "model_name")
            out[key] = sample.value
    return out


def test_metrics_names_and_values(start_gateway, fake):
    gateway = start_gateway()  # fresh counters
    complete(gateway, prompt="def f():", max_tokens=3)
    complete(gateway, prompt="def f():", max_tokens=200)  # ends at EOS: finished_reason stop
    text = httpx.get(f"{gateway.url}/metrics").text
    s = _samples(text)
    assert s["vllm:num_requests_running"] == 3
    assert s["vllm:num_requests_waiting"] == 2
    assert abs(s["vllm:kv_cache_usage_perc"] - (1000 - 600 - 150) / 1000) < 1e-9
    assert s["vllm:prefix_cache_queries_total"] == 500
    assert s["vllm:prefix_cache_hits_total"] == 120
    assert s["vllm:prompt_tokens_total"] == 500
    assert s["vllm:generation_tokens_total"] == 321
    # the request metrics are the scheduler's (GetLoad's text), served with this gateway's model_name
    assert s["vllm:time_to_first_token_seconds_count"] == 1
    assert s["vllm:e2e_request_latency_seconds_count"] == 1
    assert s["vllm:inter_token_latency_seconds_count"] == 1
    assert s["vllm:request_success_total|finished_reason=length"] == 1
    assert s["codeserve:generate_errors_total|code=RESOURCE_EXHAUSTED"] == 1
    assert "vllm:request_success_total|finished_reason=stop" not in s  # not counted a second time here
    assert s["codeserve:scheduler_up"] == 1 and s["codeserve:cache_pool_up"] == 1
    assert f'vllm:request_success_total{{finished_reason="length",model_name="{MODEL_NAME}"}} 1.0' in text
    assert f'vllm:time_to_first_token_seconds_count{{model_name="{MODEL_NAME}"}} 1.0' in text


def test_metrics_when_scheduler_is_down_report_it_instead_of_zeros(start_gateway, fake):
    gw = start_gateway(target="127.0.0.1:1")
    r = httpx.get(f"{gw.url}/metrics", timeout=30)
    assert r.status_code == 200
    s = _samples(r.text)
    assert s["codeserve:scheduler_up"] == 0
    assert "vllm:num_requests_running" not in s and "vllm:kv_cache_usage_perc" not in s


def test_metrics_when_the_cache_fails_keep_the_schedulers_request_metrics(start_gateway, fake):
    """The scheduler answered but could not read its pool (GetLoad's pool_error): scheduler_up 1, the request
    metrics and counters served, only kv_cache_usage_perc left out (cache_pool_up 0). Was: GetLoad failed as a
    whole, and /metrics showed scheduler_up 0 with every request metric gone."""
    gw = start_gateway()
    fake.load.ClearField("pools")
    fake.load.pool_error = "cache.GetPool at 127.0.0.1:1 failed: DEADLINE_EXCEEDED"
    s = _samples(httpx.get(f"{gw.url}/metrics", timeout=30).text)
    assert s["codeserve:scheduler_up"] == 1 and s["codeserve:cache_pool_up"] == 0
    assert "vllm:kv_cache_usage_perc" not in s
    assert s["vllm:request_success_total|finished_reason=length"] == 1
    assert s["vllm:num_requests_running"] == 3 and s["vllm:generation_tokens_total"] == 321
    r = httpx.get(f"{gw.url}/server_info", timeout=30)
    assert_error(r, 503, "could not read its KV pool from the cache: cache.GetPool")


def test_sglang_aliases(gateway, fake):
    assert httpx.get(f"{gateway.url}/get_server_info").json()["pools"][0]["capacity"] == 1000
    info = httpx.get(f"{gateway.url}/get_model_info").json()
    assert info["model_path"] == MODEL_NAME and info["is_generation"] is True
    assert httpx.get(f"{gateway.url}/flush_cache").json() == {"freed_tokens": 150}


def test_retrieve_model(gateway):
    import openai

    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_ready(gateway, fake_server, fake):
    assert httpx.get(f"{gateway.url}/ready").json() == {"status": "ok"}
    # SERVING, but its worker or cache is down (was: 200 while every request got a 503)
    fake.load.outage_reason = "worker service at 127.0.0.1:50052 unavailable: connection refused for 12 s"
    assert_error(httpx.get(f"{gateway.url}/ready"), 503, "reports an outage: worker service at 127.0.0.1:50052")
    fake.load.outage_reason = ""
    fake.error = (grpc.StatusCode.INTERNAL, "load broke")
    assert_error(httpx.get(f"{gateway.url}/ready"), 503, "SERVING, but its load could not be read", "load broke")
    fake.error = None
    assert httpx.get(f"{gateway.url}/ready").json() == {"status": "ok"}
    fake_server[1].set_serving(False)
    assert_error(httpx.get(f"{gateway.url}/ready"), 503, "NOT_SERVING")
    fake.load.unhealthy_reason = "worker w0 has not answered health checks for 12.0 s"
    assert_error(httpx.get(f"{gateway.url}/ready"), 503, "NOT_SERVING: worker w0 has not answered health checks")
    fake.error = (grpc.StatusCode.INTERNAL, "load broke")  # the 503 stands and says why the reason is missing
    assert_error(httpx.get(f"{gateway.url}/ready"), 503, "NOT_SERVING (its reason could not be read", "load broke")


def test_ready_and_generation_503_at_once_when_scheduler_unreachable(start_gateway, fake):
    from tests.gateway.conftest import wait_until

    gw = start_gateway(target="127.0.0.1:1", probe_interval_s=0.1, probe_timeout_s=0.5)
    r = httpx.get(f"{gw.url}/ready", timeout=30)
    assert_error(r, 503)
    assert r.headers["Retry-After"] == "1"

    def refused_with_reason() -> bool:
        resp = httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x"}, timeout=30)
        return resp.status_code == 503 and "did not answer a health check" in resp.json()["error"]["message"]

    assert wait_until(refused_with_reason)


def test_metrics_count_error_answers_by_status_and_type(start_gateway, fake):
    """Rejected requests show in /metrics (was: only successes were counted, so overload and bad input were
    invisible to an operator)."""
    import grpc

    gateway = start_gateway()  # fresh counters
    assert httpx.post(f"{gateway.url}/generate", json={"text": "x", "max_new_tokens": 3}).status_code == 400
    assert httpx.post(f"{gateway.url}/v1/completions", content=b"{not json",
                      headers={"Content-Type": "application/json"}).status_code == 400
    fake.error = (grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
    try:
        assert complete(gateway, prompt="x", max_tokens=2).status_code == 429
    finally:
        fake.error = None
    fake.error, fake.error_counted = (grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full"), True
    try:  # the scheduler counted this one (its trailer says so): not counted again here
        assert complete(gateway, prompt="x", max_tokens=2).status_code == 429
    finally:
        fake.error, fake.error_counted = None, False
    s = _samples(httpx.get(f"{gateway.url}/metrics").text)
    assert s["codeserve:request_errors_total|status=400|type=invalid_request_error"] == 2
    assert s["codeserve:request_errors_total|status=429|type=rate_limit_error"] == 1


def test_metrics_and_server_info_answer_at_once_while_the_scheduler_is_frozen(start_gateway, fake):
    """A scheduler that accepts connections and answers nothing (SIGSTOP; here a listening socket nobody reads): once
    the background probe marked it down, /metrics says ``codeserve:scheduler_up 0`` and /server_info 503 without
    waiting for the unary deadline (2 s here). Was: every scrape waited the whole deadline (5 s at the defaults)."""
    import re
    import socket
    import time

    from tests.gateway.conftest import wait_until

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        gw = start_gateway(target=f"127.0.0.1:{silent.getsockname()[1]}", probe_interval_s=0.1, probe_timeout_s=0.3)
        assert wait_until(lambda: "did not answer a health check" in httpx.post(
            f"{gw.url}/v1/completions", json={"prompt": "x"}, timeout=30).text)
        t0 = time.monotonic()
        scrape = httpx.get(f"{gw.url}/metrics", timeout=30)
        info = httpx.get(f"{gw.url}/server_info", timeout=30)
        took = time.monotonic() - t0
        assert scrape.status_code == 200 and re.search(r"^codeserve:scheduler_up\{[^}]*\} 0\.0$", scrape.text, re.M)
        assert_error(info, 503, "did not answer a health check")
        assert took < 1.0, took  # a bound well under one unary deadline (2 s), not a measured speed
    finally:
        silent.close()
