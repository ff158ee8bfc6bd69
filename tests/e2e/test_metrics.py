"""Issue 12 against all four real processes: every request counted once on the gateway's /metrics (HTTP and
gRPC, a stream the client closes included), prefix-cache counters that agree with the cached_tokens answers
report, and streamed chunks that carry exactly their own tokens (completions, chat, native /generate)."""

from __future__ import annotations

import json
import random
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.stack import generate

COUNTED = ("vllm:request_success_total", "codeserve:generate_errors_total", "codeserve:request_errors_total")


def scrape(http: httpx.Client) -> dict[str, float]:
    """/metrics as {"name|label=value...": value} (model_name left out of the key)."""
    out = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for s in family.samples:
            labels = "".join(f"|{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[s.name + labels] = s.value
    return out


def delta(after: dict, before: dict, prefix: str) -> float:
    """Sum of the change of every sample whose key starts with ``prefix``."""
    keys = {k for k in after.keys() | before.keys() if k.startswith(prefix)}
    return sum(after.get(k, 0.0) - before.get(k, 0.0) for k in keys)


def counted(after: dict, before: dict) -> float:
    """Requests counted in any request outcome (success by reason, scheduler errors, gateway errors)."""
    return sum(delta(after, before, name) for name in COUNTED)


def wait_counted(http: httpx.Client, before: dict, expected: float, timeout: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        after = scrape(http)
        if counted(after, before) >= expected or time.monotonic() > deadline:
            return after
        time.sleep(0.05)


def sse(response: httpx.Response) -> list[dict]:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[len("data: "):]))
    return events


# ---- 2. a stream the client closes ------------------------------------------------------------------------
def test_a_stream_closed_by_the_client_is_counted_once_as_abort(url, http, backend):
    """Was: prompt tokens and TTFT rose, but no request_success, no error and no e2e observation."""
    backend.wait_idle()
    before = scrape(http)
    body = {"prompt": "def f1():", "max_tokens": 512, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            got = b""
            for chunk in r.iter_bytes():
                got += chunk
                if len(got) >= 200:
                    break  # like `| head -c 200`: the client closes the stream
    after = wait_counted(http, before, 1)
    backend.wait_idle()
    after = scrape(http)
    assert counted(after, before) == 1
    assert delta(after, before, "vllm:request_success_total|finished_reason=abort") == 1
    assert delta(after, before, "vllm:e2e_request_latency_seconds_count") == 1
    assert delta(after, before, "vllm:time_to_first_token_seconds_count") == 1


def test_a_non_streamed_request_whose_client_leaves_is_counted_once_as_abort(url, http, backend):
    backend.wait_idle()
    before = scrape(http)
    body = {"prompt": "def f2():", "max_tokens": 2000, "ignore_eos": True}
    try:
        httpx.post(f"{url}/v1/completions", json=body, timeout=1.0)
        raise AssertionError("the request was meant to outlast the client's timeout")
    except httpx.ReadTimeout:
        pass
    after = wait_counted(http, before, 1)
    backend.wait_idle()
    after = scrape(http)
    assert counted(after, before) == 1
    assert delta(after, before, "vllm:request_success_total|finished_reason=abort") == 1


# ---- 4. requests over the public gRPC API ----------------------------------------------------------------
def test_grpc_requests_are_counted_on_the_gateways_metrics(http, backend):
    """Was: one gRPC request and three over HTTP raised request_success by 3."""
    backend.wait_idle()
    before = scrape(http)
    generate(backend.scheduler, text="def fibonacci(n):\n", max_new_tokens=8, skip_special_tokens=True)
    for _ in range(3):
        r = http.post("/v1/completions", json={"prompt": "x = ", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200
    assert http.post("/v1/completions", json={"prompt": "x", "max_tokens": -1}).status_code == 400  # no call made
    after = scrape(http)
    assert delta(after, before, "vllm:request_success_total") == 4
    assert delta(after, before, "vllm:e2e_request_latency_seconds_count") == 4
    assert delta(after, before, "vllm:time_to_first_token_seconds_count") == 4
    assert delta(after, before, "codeserve:request_errors_total|status=400") == 1
    assert counted(after, before) == 5


def test_a_scheduler_error_is_counted_once_at_the_scheduler(url, http, backend):
    """The scheduler refuses a second request with the id of a live one (ALREADY_EXISTS, HTTP 409): counted in
    its generate_errors, not again in the gateway's request_errors."""
    backend.wait_idle()
    before = scrape(http)
    # the first call must still run when the duplicate reaches the scheduler (it is aborted when the stream closes
    # below): its line iterator is kept. ``next(r.iter_lines())`` alone let the iterator go at once, which closed the
    # connection (httpx closes a response read part-way): the first call was aborted while the duplicate was on its
    # way, and a busy CI box let the abort in first, so the duplicate was served (200, 3,500 tokens)
    body = {"text": "def f3():", "rid": "issue12-dup", "stream": True,
            "sampling_params": {"max_new_tokens": 3500, "ignore_eos": True}}
    with httpx.Client(base_url=url, timeout=60) as client:
        with client.stream("POST", "/generate", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            first = json.loads(next(lines)[len("data: "):])  # it runs
            dup = http.post("/generate", json={**body, "stream": False})
            assert dup.status_code == 409, dup.text
            # and it still ran once the duplicate was refused: its next event carries more tokens, not an error
            later = json.loads(next(line for line in lines if line.startswith("data: "))[len("data: "):])
            assert "output_ids" in later and len(later["output_ids"]) > len(first["output_ids"]), later
    after = wait_counted(http, before, 2)
    backend.wait_idle()
    after = scrape(http)
    assert counted(after, before) == 2
    assert delta(after, before, "codeserve:generate_errors_total|code=ALREADY_EXISTS") == 1
    assert delta(after, before, "vllm:request_success_total|finished_reason=abort") == 1
    assert delta(after, before, "codeserve:request_errors_total") == 0


# ---- 1. prefix-cache counters and cached_tokens ----------------------------------------------------------
def test_prefix_counters_agree_with_the_cached_tokens_answers_report(http, backend):
    backend.wait_idle()
    assert http.post("/flush_cache").status_code == 200
    rng = random.Random(12)
    ids = [rng.randrange(100, 1024) for _ in range(300)]
    before = scrape(http)
    first = http.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 2,
                                                                                "ignore_eos": True}}).json()
    backend.wait_idle()  # its insert is deferred after its answer (docs/architecture.md, Finish): sent by now
    longer = ids + [rng.randrange(100, 1024) for _ in range(40)]
    second = http.post("/v1/completions", json={"prompt": longer, "max_tokens": 2, "ignore_eos": True}).json()
    after = scrape(http)
    cached = [first["meta_info"]["cached_tokens"], second["usage"]["prompt_tokens_details"]["cached_tokens"]]
    assert cached[0] == 0 and cached[1] >= 299
    assert delta(after, before, "vllm:prefix_cache_queries_total") == 300 + 340
    assert delta(after, before, "vllm:prefix_cache_hits_total") == sum(cached)


# ---- 3. streamed chunks carry exactly their own tokens ---------------------------------------------------
def _check_completion_chunks(http, body: dict) -> None:
    whole = http.post("/v1/completions", json=body).json()["choices"][0]
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        chunks = [e["choices"][0] for e in sse(r) if e["choices"]]
    *running, last = chunks
    for c in running:
        assert c["text"], f"a chunk of empty text: {c}"
        assert "".join(c["logprobs"]["tokens"]) == c["text"], c
    assert last["finish_reason"]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert [t for c in chunks for t in c["logprobs"]["tokens"]] == whole["logprobs"]["tokens"]


def test_completion_chunks_with_a_stop_string_carry_their_own_tokens(http):
    """The issue's stream: ''/['\\n'] then '\\nimport'/['import'] (held-back text beside another token)."""
    _check_completion_chunks(http, {"prompt": "import os\n", "stop": ["\n\n\n"], "max_tokens": 24,
                                    "temperature": 0, "logprobs": 1})


def test_completion_chunks_without_a_stop_string_carry_their_own_tokens(http):
    _check_completion_chunks(http, {"prompt": "def add(a, b):\n", "max_tokens": 32, "temperature": 0,
                                    "logprobs": 0, "ignore_eos": True})


def test_chat_chunks_carry_their_own_tokens(http):
    """Chat's template stops begin with a newline, so every newline was held back: {"content": ""} with
    token ['\\n'], then '\\n fetch' with [' fetch']."""
    body = {"messages": [{"role": "user", "content": "Write add(a, b) in Python."}], "max_tokens": 40,
            "temperature": 0, "logprobs": True}
    whole = http.post("/v1/chat/completions", json=body).json()["choices"][0]
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        chunks = [e["choices"][0] for e in sse(r) if e["choices"]]
    role, *content, last = chunks
    assert role["delta"] == {"role": "assistant", "content": ""} and role["logprobs"] is None
    assert last["finish_reason"]
    for c in content:
        assert c["delta"]["content"], f"a content chunk of empty text: {c}"
        assert "".join(e["token"] for e in c["logprobs"]["content"]) == c["delta"]["content"], c
    text = "".join(c["delta"].get("content", "") for c in content + [last])
    assert text == whole["message"]["content"]
    streamed_tokens = [e["token"] for c in content + [last] if c["logprobs"] for e in c["logprobs"]["content"]]
    assert streamed_tokens == [e["token"] for e in whole["logprobs"]["content"]]


def test_native_generate_chunks_carry_their_own_tokens(http, tokenizer):
    body = {"text": "import os\n", "sampling_params": {"max_new_tokens": 24, "temperature": 0, "stop": ["\n\n\n"]},
            "return_logprob": True}
    whole = http.post("/generate", json=body).json()
    with http.stream("POST", "/generate", json={**body, "stream": True}) as r:
        chunks = sse(r)
    *running, last = chunks
    previous = ""
    for c in running:  # native chunks are cumulative: each one adds text, and its tokens are that text
        assert len(c["text"]) > len(previous), f"a chunk that adds no text: {c}"
        assert tokenizer.decode(c["output_ids"]) == c["text"]
        assert len(c["meta_info"]["output_token_logprobs"]) == len(c["output_ids"])
        previous = c["text"]
    assert last["text"] == whole["text"] and last["output_ids"] == whole["output_ids"]
    assert [t[1] for t in last["meta_info"]["output_token_logprobs"]] == whole["output_ids"]


# ---- review: readiness probes are not user requests --------------------------------------------------------
def test_health_generate_probes_are_not_counted(http, backend):
    """Was: each /health_generate counted as a request (request_success, TTFT, e2e, prompt/generation tokens)."""
    backend.wait_idle()
    before = scrape(http)
    for _ in range(3):
        r = http.get("/health_generate")
        assert r.status_code == 200 and r.json()["tokens"] == 1, r.text
    after = scrape(http)
    for name in (*COUNTED, "vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total"):
        assert delta(after, before, name) == 0, name


def test_decode_steps_per_forward_reach_the_gateways_metrics(http, backend):
    """The loop's histogram of decode steps per Forward (scheduler_svc/stats.py, through GetLoad): on CPU K is 1,
    so 8 tokens are the prefill's and 7 one-step decode Forwards, each counted once in the le=1 bucket."""
    backend.wait_idle()
    before = scrape(http)
    r = http.post("/generate", json={"text": "def add(a, b):", "sampling_params": {"max_new_tokens": 8,
                                                                                  "ignore_eos": True}})
    assert r.status_code == 200, r.text
    after = scrape(http)
    assert delta(after, before, "codeserve:decode_forward_steps_count") == 7
    assert delta(after, before, "codeserve:decode_forward_steps_bucket|le=1.0") == 7
    assert delta(after, before, "codeserve:decode_forwards_steps_cut_total") == 0  # K = 1: nothing to cut
