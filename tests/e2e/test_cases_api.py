"""Cases K1-K3 and A1-A5 of ../shared/cases/handed-1.md through all four real services over HTTP."""

from __future__ import annotations

import json

import pytest

from tests.scheduler import hf


def complete(http, model_name, **body):
    return http.post("/v1/completions", json={"model": model_name, **body})


def stream_text(http, model_name, **body) -> tuple[str, list[dict]]:
    chunks = []
    with http.stream("POST", "/v1/completions", json={"model": model_name, "stream": True, **body}) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"]), chunks


@pytest.mark.parametrize("prompt", ["def main():", "def fibonacci(n):\n"])
def test_k1_one_kv_head_matches_hf(http, model_name, model_path, tokenizer, backend, prompt) -> None:
    ids = tokenizer(prompt)["input_ids"]
    want, want_lp = hf.greedy(model_path, ids, 32)
    reply = complete(http, model_name, prompt=prompt, max_tokens=32, temperature=0, logprobs=1)
    assert reply.status_code == 200, reply.text
    lp = reply.json()["choices"][0]["logprobs"]["token_logprobs"]
    assert len(lp) == len(want)
    assert max(abs(a - b) for a, b in zip(lp, want_lp)) < 1e-4
    assert reply.json()["choices"][0]["text"] == tokenizer.decode(want, skip_special_tokens=True,
                                                                   clean_up_tokenization_spaces=False)
    cfg = json.loads(open(f"{model_path}/config.json").read())
    assert cfg["multi_query"] is True


def test_k2_fim_markers_are_single_ids_and_output_matches_hf(http, model_name, model_path, tokenizer) -> None:
    prompt = ("<fim_prefix>def quick_sort(arr):\n    if len(arr) <= 1:\n        return arr\n    <fim_suffix>\n"
              "    return quick_sort(left) + mid + quick_sort(right)\n<fim_middle>")
    ids = tokenizer(prompt)["input_ids"]
    for marker in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"):
        assert ids.count(tokenizer.convert_tokens_to_ids(marker)) == 1
    want, _ = hf.greedy(model_path, ids, 64)
    reply = complete(http, model_name, prompt=prompt, max_tokens=64, temperature=0)
    body = reply.json()
    assert body["usage"]["prompt_tokens"] == len(ids)
    text = body["choices"][0]["text"]
    assert text == tokenizer.decode(want, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert not any(m in text for m in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<|endoftext|>"))
    want_reason = "stop" if want[-1] == tokenizer.eos_token_id else "length"
    assert body["choices"][0]["finish_reason"] == want_reason


def test_k3_code_whitespace_survives_echo_and_streaming(http, model_name, model_path, tokenizer) -> None:
    prompt = "x = a ., b ! c ?\nrun(\"python3 ./src/main.py $IN $OUT\" , 'it' )\n"
    reply = complete(http, model_name, prompt=prompt, max_tokens=1, temperature=0, echo=True)
    text = reply.json()["choices"][0]["text"]
    assert text.encode()[:len(prompt.encode())] == prompt.encode()
    want, _ = hf.greedy(model_path, tokenizer(prompt)["input_ids"], 1)
    assert text[len(prompt):] == tokenizer.decode(want, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    indented = "    if x:\n        return  y\n"
    plain = complete(http, model_name, prompt=indented, max_tokens=20, temperature=0).json()["choices"][0]["text"]
    streamed, _ = stream_text(http, model_name, prompt=indented, max_tokens=20, temperature=0)
    assert streamed == plain


def test_a1_empty_inputs_are_400_and_the_next_request_succeeds(http, model_name) -> None:
    for path, body in [("/v1/completions", {"model": model_name, "prompt": ""}),
                       ("/v1/completions", {"model": model_name, "prompt": [""]}),
                       ("/generate", {"text": ""}), ("/generate", {"input_ids": []})]:
        reply = http.post(path, json=body)
        assert reply.status_code == 400, (path, body, reply.text)
        assert "empty" in reply.text.lower()
    assert complete(http, model_name, prompt="x = 1", max_tokens=2).status_code == 200


def test_a2_echo_with_zero_new_tokens(http, model_name) -> None:
    prompt = "def add(a, b):\n    return a + b"
    body = complete(http, model_name, prompt=prompt, max_tokens=0, echo=True, logprobs=1).json()
    choice = body["choices"][0]
    assert choice["text"] == prompt and body["usage"]["completion_tokens"] == 0
    assert choice["logprobs"]["token_logprobs"][0] is None
    assert all(isinstance(x, float) for x in choice["logprobs"]["token_logprobs"][1:])
    assert complete(http, model_name, prompt=prompt, max_tokens=0, echo=True).status_code == 200
    no_echo = complete(http, model_name, prompt=prompt, max_tokens=0)
    assert no_echo.status_code in (200, 400)
    if no_echo.status_code == 200:
        assert no_echo.json()["choices"][0]["text"] == ""


def test_a3_exactly_n_tokens(http, model_name) -> None:
    prompt = "import json\n"
    longer = complete(http, model_name, prompt=prompt, max_tokens=8, temperature=0, logprobs=1, ignore_eos=True).json()
    for n in (1, 2):
        body = complete(http, model_name, prompt=prompt, max_tokens=n, temperature=0, logprobs=1,
                        ignore_eos=True).json()
        choice = body["choices"][0]
        assert body["usage"]["completion_tokens"] == n
        assert len(choice["logprobs"]["token_logprobs"]) == n and choice["finish_reason"] == "length"
        assert choice["logprobs"]["tokens"] == longer["choices"][0]["logprobs"]["tokens"][:n]
    for n in (0, 1):
        native = http.post("/generate", json={"text": prompt, "sampling_params": {
            "max_new_tokens": n, "temperature": 0, "ignore_eos": True}}).json()
        assert len(native["output_ids"]) == n and native["meta_info"]["completion_tokens"] == n
        assert native["meta_info"]["finish_reason"]["type"] == "length"


def test_a4_stop_strings_never_leak(http, model_name, tokenizer, model_path) -> None:
    prompt = "# alphabet\nletters = 'ABC"
    # Make a stop string that surely occurs: a slice of the greedy continuation itself.
    plain = complete(http, model_name, prompt=prompt, max_tokens=24, temperature=0, ignore_eos=True).json()
    full = plain["choices"][0]["text"]
    assert len(full) >= 6
    stop = full[3:7]
    non_stream = complete(http, model_name, prompt=prompt, max_tokens=24, temperature=0, stop=[stop]).json()
    assert non_stream["choices"][0]["text"] == full[:full.index(stop)]
    assert non_stream["choices"][0]["finish_reason"] == "stop"
    streamed, chunks = stream_text(http, model_name, prompt=prompt, max_tokens=24, temperature=0, stop=[stop])
    assert streamed == non_stream["choices"][0]["text"]
    assert stop not in streamed and len(chunks) >= 2
    # A stop that matches at once gives "" with finish_reason stop.
    first = full[0]
    at_once = complete(http, model_name, prompt=prompt, max_tokens=24, temperature=0, stop=[first]).json()
    assert at_once["choices"][0]["text"] == "" and at_once["choices"][0]["finish_reason"] == "stop"


def test_a5_too_long_prompts(http, model_name, backend) -> None:
    info = http.get("/server_info").json()
    limit = info["n_positions"]
    too_long = complete(http, model_name, prompt=[5] * (limit + 10), max_tokens=4)
    assert too_long.status_code == 400
    assert str(limit + 10) in too_long.text and str(limit) in too_long.text
    near = complete(http, model_name, prompt=[5] * (limit - 4), max_tokens=16, temperature=0, ignore_eos=True)
    assert near.status_code in (200, 400), near.text
    if near.status_code == 200:
        body = near.json()
        assert body["usage"]["completion_tokens"] <= 4
        assert body["choices"][0]["finish_reason"] == "length"
    # The worker stayed up and serves.
    assert complete(http, model_name, prompt="print(1)", max_tokens=2).status_code == 200
    assert http.get("/health_generate").status_code == 200
