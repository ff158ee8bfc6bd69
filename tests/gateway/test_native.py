"""SGLang-native /generate, /tokenize and /detokenize."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.conftest import N_POSITIONS
from tests.gateway.helpers import stream
from tests.gateway.test_errors import assert_error

K2_PROMPT = ("<fim_prefix>def quick_sort(arr):\n    if len(arr) <= 1:\n        return arr\n    <fim_suffix>\n"
             "    return quick_sort(left) + mid + quick_sort(right)\n<fim_middle>")


def gen(gateway, **payload) -> httpx.Response:
    return httpx.post(f"{gateway.url}/generate", json=payload, timeout=30)


def test_generate_text(gateway, fake, tokenizer):
    r = gen(gateway, text="def add(a, b):\n", sampling_params={"max_new_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    script = tokenizer.encode(fake.continuation)
    assert body["text"] == tokenizer.decode(script[:3])
    assert body["output_ids"] == script[:3]
    meta = body["meta_info"]
    assert meta["prompt_tokens"] == len(tokenizer.encode("def add(a, b):\n"))
    assert meta["completion_tokens"] == 3
    assert meta["cached_tokens"] == 0
    assert meta["finish_reason"] == {"type": "length", "length": 3}
    assert meta["e2e_latency"] >= 0
    assert "output_token_logprobs" not in meta


def test_generate_default_max_new_tokens_is_128_and_stop_at_eos(gateway, fake, tokenizer):
    body = gen(gateway, input_ids=[5, 6, 7]).json()
    assert fake.requests[-1].max_new_tokens == min(128, N_POSITIONS - 3)
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": "<|endoftext|>"}
    assert body["output_ids"][-1] == 0
    assert body["text"] == fake.continuation  # EOS skipped in the text


def test_generate_stop_token_id_reported_as_int(gateway, fake, tokenizer):
    stop_id = tokenizer.encode(fake.continuation)[2]
    body = gen(gateway, text="x", sampling_params={"stop_token_ids": [stop_id]}).json()
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert fake.requests[-1].stop_token_ids == [stop_id]


def test_generate_stop_string(gateway, fake):
    fake.continuation = "ABCDEFGHIJ"
    body = gen(gateway, text="x", sampling_params={"stop": "DEF", "max_new_tokens": 20}).json()
    assert body["text"] == "ABC"
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": "DEF"}


def test_generate_batch_text_and_ids(gateway, fake, tokenizer):
    body = gen(gateway, text=["a", "bb"], sampling_params=[{"max_new_tokens": 1}, {"max_new_tokens": 2}]).json()
    assert isinstance(body, list) and len(body) == 2
    assert [b["meta_info"]["completion_tokens"] for b in body] == [1, 2]
    body = gen(gateway, input_ids=[[5, 6], [7, 8, 9]], sampling_params={"max_new_tokens": 2}, rid=["r1", "r2"]).json()
    assert [b["meta_info"]["prompt_tokens"] for b in body] == [2, 3]
    assert [b["meta_info"]["id"] for b in body] == ["r1", "r2"]
    assert sorted(r.request_id for r in fake.requests[-2:]) == ["r1", "r2"]


@pytest.mark.parametrize("payload,param", [
    ({"text": "x", "input_ids": [1]}, "text"),
    ({}, "text"),
    ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
    ({"text": "x", "sampling_params": {"regex": "a+"}}, "sampling_params.regex"),
    ({"text": "x", "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens"),
    ({"input_ids": [1, 99999]}, "input_ids"),
    ({"text": "x", "max_new_tokens": 3, "temperature": 0}, "max_new_tokens"),  # was ignored: 128 tokens
    ({"text": "x", "n": 2}, "n"),
])
def test_generate_bad_input(gateway, fake, payload, param):
    assert_error(gen(gateway, **payload), 400, param=param)
    assert fake.requests == []


@pytest.mark.parametrize("n", [0, 1])
def test_a3_native_exactly_n_tokens(gateway, fake, tokenizer, n):
    body = gen(gateway, text="def main():", return_logprob=True,
               sampling_params={"max_new_tokens": n, "temperature": 0}).json()
    meta = body["meta_info"]
    assert meta["completion_tokens"] == n
    assert len(body["output_ids"]) == n
    assert len(meta["output_token_logprobs"]) == n
    assert meta["finish_reason"] == {"type": "length", "length": n}
    assert fake.requests[-1].max_new_tokens == n


def test_generate_logprobs(gateway, fake, tokenizer):
    ids = tokenizer.encode("def add(a, b):")
    body = gen(gateway, input_ids=ids, return_logprob=True, top_logprobs_num=2, logprob_start_len=0,
               return_text_in_logprobs=True, sampling_params={"max_new_tokens": 2}).json()
    meta = body["meta_info"]
    sent = fake.requests[-1]
    assert sent.return_logprob and sent.return_prompt_logprobs and sent.top_logprobs_num == 2
    out = meta["output_token_logprobs"]
    assert [t[1] for t in out] == body["output_ids"]
    assert [t[0] for t in out] == pytest.approx([-0.1, -0.2], abs=1e-6)
    assert [t[2] for t in out] == [tokenizer.token_text(t) for t in body["output_ids"]]
    assert [[e[1] for e in pos] for pos in meta["output_top_logprobs"]] == [[t, t + 1] for t in body["output_ids"]]
    inp = meta["input_token_logprobs"]
    assert [t[1] for t in inp] == ids
    assert inp[0][0] is None
    assert [t[0] for t in inp[1:]] == pytest.approx([-0.5 - 0.01 * i for i in range(1, len(ids))], abs=1e-6)
    assert meta["input_top_logprobs"][0] is None
    # logprob_start_len 3: input logprobs from position 3 on
    meta = gen(gateway, input_ids=ids, return_logprob=True, logprob_start_len=3,
               sampling_params={"max_new_tokens": 1}).json()["meta_info"]
    assert [t[1] for t in meta["input_token_logprobs"]] == ids[3:]
    # default logprob_start_len -1: no prompt logprobs asked
    meta = gen(gateway, input_ids=ids, return_logprob=True, sampling_params={"max_new_tokens": 1}).json()["meta_info"]
    assert "input_token_logprobs" not in meta and not fake.requests[-1].return_prompt_logprobs


def test_generate_stream_is_cumulative(gateway, fake, tokenizer):
    status, events = stream(gateway, "/generate", {"text": "def f():", "stream": True,
                                                   "sampling_params": {"max_new_tokens": 6}})
    assert status == 200 and events[-1] == "[DONE]"
    outs = events[:-1]
    script = tokenizer.encode(fake.continuation)
    whole = tokenizer.decode(script[:6])
    for a, b in zip(outs, outs[1:]):
        assert b["text"].startswith(a["text"])
        assert b["output_ids"][:len(a["output_ids"])] == a["output_ids"]
    assert outs[-1]["text"] == whole and outs[-1]["output_ids"] == script[:6]
    assert all(o["meta_info"]["finish_reason"] is None for o in outs[:-1])
    assert outs[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert outs[-1]["meta_info"]["completion_tokens"] == 6


def test_generate_stream_batch_has_index(gateway, fake):
    status, events = stream(gateway, "/generate", {"text": ["a", "b"], "stream": True,
                                                   "sampling_params": {"max_new_tokens": 2}})
    finals = {e["index"]: e for e in events[:-1] if e["meta_info"]["finish_reason"]}
    assert sorted(finals) == [0, 1]


def test_k2_fim_markers_are_single_special_ids(gateway, fake, tokenizer):
    r = httpx.post(f"{gateway.url}/tokenize", json={"prompt": K2_PROMPT}).json()
    specials = [tokenizer.encode(m)[0] for m in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")]
    assert all(len(tokenizer.encode(m)) == 1 for m in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))
    assert [t for t in r["tokens"] if t in specials] == specials
    assert r["count"] == len(r["tokens"]) == len(tokenizer.encode(K2_PROMPT))
    assert r["max_model_len"] == N_POSITIONS
    body = gen(gateway, text=K2_PROMPT, sampling_params={"max_new_tokens": 1}).json()
    assert body["meta_info"]["prompt_tokens"] == r["count"]
    fake.continuation = "<fim_pad>pass"
    out = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": K2_PROMPT, "max_tokens": 10}).json()
    assert "<fim_" not in out["choices"][0]["text"] and fake.requests[-1].skip_special_tokens


def test_tokenize_detokenize_round_trip_keeps_code_whitespace(gateway, tokenizer):
    text = "x = a ., b ! c ?\nrun(\"python3 ./src/main.py $IN $OUT\" , 'it' )\n\tcaf\u00e9 \U0001f600"
    ids = httpx.post(f"{gateway.url}/tokenize", json={"prompt": text}).json()["tokens"]
    assert ids == tokenizer.encode(text)
    back = httpx.post(f"{gateway.url}/detokenize", json={"tokens": ids}).json()
    assert back == {"prompt": text}
    eos = httpx.post(f"{gateway.url}/detokenize", json={"tokens": [0, *ids], "skip_special_tokens": True}).json()
    assert eos == {"prompt": text}


def test_tokenize_messages_and_errors(gateway, tokenizer):
    r = httpx.post(f"{gateway.url}/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert tokenizer.decode(r["tokens"]) == "### Instruction:\nhi\n\n### Response:\n"
    assert httpx.post(f"{gateway.url}/tokenize", json={"prompt": ""}).json()["count"] == 0
    assert_error(httpx.post(f"{gateway.url}/tokenize", json={}), 400)
    assert_error(httpx.post(f"{gateway.url}/detokenize", json={"tokens": [400]}), 400, "400", param="tokens")
