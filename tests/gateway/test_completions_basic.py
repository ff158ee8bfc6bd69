"""/v1/completions against the fake scheduler: every prompt form, n, streaming format."""

from __future__ import annotations

import httpx

from tests.gateway.conftest import MODEL_NAME, N_POSITIONS
from tests.gateway.helpers import complete, stream, whole_and_streamed


def test_completion_text_prompt(gateway, fake, tokenizer):
    r = complete(gateway, prompt="def add(a, b):\n", max_tokens=4, temperature=0)
    assert r.status_code == 200, r.text
    body = r.json()
    script = tokenizer.encode(fake.continuation)
    assert body["object"] == "text_completion"
    assert body["model"] == MODEL_NAME
    assert body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == tokenizer.decode(script[:4])
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["logprobs"] is None
    prompt_ids = tokenizer.encode("def add(a, b):\n")
    assert body["usage"] == {"prompt_tokens": len(prompt_ids), "completion_tokens": 4,
                             "total_tokens": len(prompt_ids) + 4, "prompt_tokens_details": {"cached_tokens": 0}}
    sent = fake.requests[-1]
    assert sent.HasField("input_ids")
    assert list(sent.input_ids.ids) == prompt_ids
    assert sent.max_new_tokens == 4
    assert sent.sampling.temperature == 0
    assert sent.skip_special_tokens is True


def test_sampling_fields_reach_the_scheduler(gateway, fake):
    r = complete(gateway, prompt="x", max_tokens=3, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, seed=1234,
                 presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.2, ignore_eos=True,
                 stop=["\n\n", "END"], stop_token_ids=[7], skip_special_tokens=False,
                 include_stop_str_in_output=True)
    assert r.status_code == 200, r.text
    sent = fake.requests[-1]
    s = sent.sampling
    assert (round(s.temperature, 5), round(s.top_p, 5), s.top_k, round(s.min_p, 5)) == (0.7, 0.9, 40, 0.05)
    assert (s.has_seed, s.seed) == (True, 1234)
    assert (round(s.presence_penalty, 5), round(s.frequency_penalty, 5), round(s.repetition_penalty, 5)) == (
        0.5, -0.5, 1.2)
    assert list(sent.stop) == ["\n\n", "END"]
    assert list(sent.stop_token_ids) == [7]
    assert sent.ignore_eos and not sent.skip_special_tokens and sent.no_stop_trim
    assert not sent.return_logprob and not sent.return_prompt_logprobs


def test_default_max_tokens_is_16_and_no_seed(gateway, fake):
    fake.continuation = "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 2
    r = complete(gateway, prompt="x")
    assert r.status_code == 200
    assert fake.requests[-1].max_new_tokens == 16
    assert fake.requests[-1].sampling.has_seed is False
    assert r.json()["usage"]["completion_tokens"] == 16


def test_prompt_forms(gateway, fake, tokenizer):
    ids_a = tokenizer.encode("def add(a, b):")
    ids_b = tokenizer.encode("import os")
    cases = [
        ("def add(a, b):", [ids_a]),
        (["def add(a, b):", "import os"], [ids_a, ids_b]),
        (ids_a, [ids_a]),
        ([ids_a, ids_b], [ids_a, ids_b]),
    ]
    for prompt, expected in cases:
        before = len(fake.requests)
        r = complete(gateway, prompt=prompt, max_tokens=2)
        assert r.status_code == 200, (prompt, r.text)
        sent = [list(req.input_ids.ids) for req in fake.requests[before:]]
        assert sorted(sent) == sorted(expected)
        body = r.json()
        assert [c["index"] for c in body["choices"]] == list(range(len(expected)))
        assert body["usage"]["prompt_tokens"] == sum(len(x) for x in expected)
        assert body["usage"]["completion_tokens"] == 2 * len(expected)


def test_n_fans_out_with_distinct_seeds_and_counts_prompt_once(gateway, fake, tokenizer):
    r = complete(gateway, prompt=["a", "b"], n=3, max_tokens=2, seed=10)
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["choices"]) == 6
    assert [c["index"] for c in body["choices"]] == list(range(6))
    reqs = fake.requests[-6:]
    assert sorted(r.sampling.seed for r in reqs) == [10, 10, 11, 11, 12, 12]
    assert len({r.request_id for r in reqs}) == 6
    prompt_tokens = len(tokenizer.encode("a")) + len(tokenizer.encode("b"))
    assert body["usage"]["prompt_tokens"] == prompt_tokens
    assert body["usage"]["completion_tokens"] == 12


def test_cached_tokens_reported(gateway, fake):
    fake.cached_tokens = 3
    r = complete(gateway, prompt="def add(a, b):\n    return", max_tokens=1)
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 3


def test_stream_equals_nonstream_and_ends_with_done(gateway, fake):
    whole, chunks = whole_and_streamed(gateway, {"prompt": "def add(a, b):\n", "max_tokens": 40, "temperature": 0})
    assert all(c["object"] == "text_completion" and c["usage"] is None for c in chunks)
    assert all(c["id"] == chunks[0]["id"] for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_stream_include_usage(gateway, fake, tokenizer):
    fake.cached_tokens = 2
    status, events = stream(gateway, "/v1/completions", {
        "model": MODEL_NAME, "prompt": ["def f():", "x ="], "n": 2, "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True}})
    assert status == 200
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert last["choices"] == []
    lengths = [len(tokenizer.encode("def f():")), len(tokenizer.encode("x ="))]
    prompt_tokens = sum(lengths)
    cached = sum(min(2, n - 1) for n in lengths)  # the fake reports min(2, prompt - 1) per prompt
    assert last["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 12,
                             "total_tokens": prompt_tokens + 12, "prompt_tokens_details": {"cached_tokens": cached}}
    texts: dict[int, str] = {}
    finishes = {}
    for chunk in events[:-2]:
        (choice,) = chunk["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert sorted(texts) == [0, 1, 2, 3]
    expected = tokenizer.decode(tokenizer.encode(fake.continuation)[:3])
    assert all(t == expected for t in texts.values())
    assert finishes == {0: "length", 1: "length", 2: "length", 3: "length"}


def test_stream_headers(gateway, fake):
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json={"prompt": "x", "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        r.read()


def test_stream_without_include_usage_has_no_usage_chunk(gateway, fake):
    status, events = stream(gateway, "/v1/completions",
                            {"model": MODEL_NAME, "prompt": "x", "max_tokens": 2, "stream": True})
    assert status == 200
    assert all(e == "[DONE]" or (e["choices"] and e["usage"] is None) for e in events)


def test_stop_strings_pass_through_and_stream_equals_whole(gateway, fake):
    fake.continuation = "ABCDEFGHIJKLMNOP"
    whole, chunks = whole_and_streamed(gateway, {"prompt": "# alphabet\nletters = 'ABC", "max_tokens": 30,
                                                 "stop": ["DEFGHIJ"]})
    assert whole["choices"][0]["text"] == "ABC"
    assert whole["choices"][0]["finish_reason"] == "stop"
    pieces = [c["choices"][0]["text"] for c in chunks]
    assert "".join(pieces) == "ABC"
    assert not any("D" in p for p in pieces)


def test_openai_client_completions(gateway, fake, tokenizer):
    import openai

    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused")
    out = client.completions.create(model=MODEL_NAME, prompt="def add(a, b):\n", max_tokens=5, temperature=0)
    expected = tokenizer.decode(tokenizer.encode(fake.continuation)[:5])
    assert out.choices[0].text == expected
    assert out.usage.completion_tokens == 5
    streamed = client.completions.create(model=MODEL_NAME, prompt="def add(a, b):\n", max_tokens=5, stream=True,
                                         stream_options={"include_usage": True})
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert chunks[-1].usage.completion_tokens == 5
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]


def test_models_endpoint(gateway):
    body = httpx.get(f"{gateway.url}/v1/models").json()
    assert body["object"] == "list"
    assert body["data"][0]["id"] == MODEL_NAME
    assert body["data"][0]["max_model_len"] == N_POSITIONS


def test_a4_stop_that_matches_at_once_gives_empty_text(gateway, fake):
    fake.continuation = "\nfoo bar"
    whole, chunks = whole_and_streamed(gateway, {"prompt": "def f():", "max_tokens": 10, "stop": ["\n"]})
    assert whole["choices"][0]["text"] == ""
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert [c["choices"][0]["text"] for c in chunks] == [""]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a4_code_stop_string_never_streams_a_fragment(gateway, fake):
    fake.continuation = "    return 1\n\ndef g():\n    pass\n"
    body, chunks = whole_and_streamed(gateway, {"prompt": "def f():\n", "max_tokens": 30, "stop": ["\ndef "]})
    whole = body["choices"][0]["text"]
    assert whole == "    return 1\n"
    pieces = [c["choices"][0]["text"] for c in chunks]
    assert "".join(pieces) == whole
    assert not any("def" in p for p in pieces)


def test_error_after_streaming_began_is_an_error_event_then_done(gateway, fake, monkeypatch):
    import grpc

    original = fake._generate

    def failing(request, ids, context, ended):
        for i, msg in enumerate(original(request, ids, context, ended)):
            if i == 2:
                context.abort(grpc.StatusCode.UNAVAILABLE, "worker lost")
            yield msg

    monkeypatch.setattr(fake, "_generate", failing)
    status, events = stream(gateway, "/v1/completions", {"model": MODEL_NAME, "prompt": "x", "max_tokens": 10,
                                                         "stream": True})
    assert status == 200
    assert events[-1] == "[DONE]"
    assert events[-2] == {"error": {"message": "worker lost", "type": "service_unavailable", "param": None,
                                    "code": 503}}
    assert len(events) == 4  # two chunks, the error, [DONE]
