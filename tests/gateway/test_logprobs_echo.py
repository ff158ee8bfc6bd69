"""Logprobs (OpenAI legacy format), echo (K3 byte identity), A2 (echo with zero new tokens), A3 (exactly N)."""

from __future__ import annotations

import pytest

from tests.gateway.conftest import MODEL_NAME
from tests.gateway.helpers import complete, stream

K3_PROMPT = "x = a ., b ! c ?\nrun(\"python3 ./src/main.py $IN $OUT\" , 'it' )\n"
A2_PROMPT = "def add(a, b):\n    return a + b"


def test_legacy_logprobs_format(gateway, fake, tokenizer):
    r = complete(gateway, prompt="def add(a, b):\n", max_tokens=3, logprobs=2, temperature=0)
    assert r.status_code == 200, r.text
    sent = fake.requests[-1]
    assert sent.return_logprob and sent.top_logprobs_num == 2 and not sent.return_prompt_logprobs
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    ids = tokenizer.encode(fake.continuation)[:3]
    assert lp["tokens"] == [tokenizer.token_text(t) for t in ids]
    assert lp["token_logprobs"] == pytest.approx([-0.1, -0.2, -0.3], abs=1e-6)
    for i, (token, top) in enumerate(zip(ids, lp["top_logprobs"])):
        expected = {tokenizer.token_text(token): -0.1 * (i + 1), tokenizer.token_text(token + 1): -0.1 * (i + 1) - 1}
        assert top.keys() == expected.keys()
        assert list(top.values()) == pytest.approx(list(expected.values()), abs=1e-6)
    text = choice["text"]
    assert lp["text_offset"][0] == 0
    for i in range(3):
        end = lp["text_offset"][i + 1] if i + 1 < 3 else len(text)
        assert text[lp["text_offset"][i]:end] == tokenizer.decode(ids[i:i + 1])


def test_logprobs_zero_gives_chosen_token_only(gateway, fake, tokenizer):
    r = complete(gateway, prompt="def", max_tokens=2, logprobs=0)
    lp = r.json()["choices"][0]["logprobs"]
    ids = tokenizer.encode(fake.continuation)[:2]
    assert [list(d.keys()) for d in lp["top_logprobs"]] == [[tokenizer.token_text(t)] for t in ids]


@pytest.mark.parametrize("max_tokens", [1, 5])
def test_k3_echo_is_byte_identical(gateway, fake, tokenizer, max_tokens):
    r = complete(gateway, prompt=K3_PROMPT, echo=True, max_tokens=max_tokens, temperature=0)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    generated = tokenizer.decode(tokenizer.encode(fake.continuation)[:max_tokens], skip_special_tokens=True)
    assert text.encode() == (K3_PROMPT + generated).encode()
    assert "python3 ./src/main.py" in text and "a ., b ! c ?" in text
    status, events = stream(gateway, "/v1/completions", {"model": MODEL_NAME, "prompt": K3_PROMPT, "echo": True,
                                                         "max_tokens": max_tokens, "stream": True})
    assert status == 200
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == text


def test_echo_of_token_id_prompt_is_its_decoded_text(gateway, fake, tokenizer):
    ids = tokenizer.encode("<fim_prefix>def f():\n    <fim_suffix>\n<fim_middle>")
    r = complete(gateway, prompt=ids, echo=True, max_tokens=0)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "<fim_prefix>def f():\n    <fim_suffix>\n<fim_middle>"


def test_a2_echo_zero_tokens_with_logprobs(gateway, fake, tokenizer):
    r = complete(gateway, prompt=A2_PROMPT, max_tokens=0, echo=True, logprobs=1)
    assert r.status_code == 200, r.text
    sent = fake.requests[-1]
    assert sent.max_new_tokens == 0 and sent.return_prompt_logprobs
    body = r.json()
    choice = body["choices"][0]
    assert choice["text"] == A2_PROMPT
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 0
    ids = tokenizer.encode(A2_PROMPT)
    assert body["usage"]["prompt_tokens"] == len(ids)
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:] == pytest.approx([-0.5 - 0.01 * i for i in range(1, len(ids))], abs=1e-6)
    assert lp["tokens"] == [tokenizer.token_text(t) for t in ids]
    offsets = lp["text_offset"] + [len(A2_PROMPT)]
    assert "".join(A2_PROMPT[offsets[i]:offsets[i + 1]] for i in range(len(ids))) == A2_PROMPT
    assert all(offsets[i] <= offsets[i + 1] for i in range(len(ids)))


def test_a2_echo_zero_tokens_logprobs_then_generated(gateway, fake, tokenizer):
    r = complete(gateway, prompt=A2_PROMPT, max_tokens=2, echo=True, logprobs=1)
    lp = r.json()["choices"][0]["logprobs"]
    n_prompt = len(tokenizer.encode(A2_PROMPT))
    assert len(lp["token_logprobs"]) == n_prompt + 2
    assert lp["token_logprobs"][n_prompt:] == pytest.approx([-0.1, -0.2], abs=1e-6)
    assert lp["text_offset"][n_prompt] == len(A2_PROMPT)


def test_a2_without_logprobs_and_without_echo(gateway, fake):
    r = complete(gateway, prompt=A2_PROMPT, max_tokens=0, echo=True)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == A2_PROMPT
    r = complete(gateway, prompt=A2_PROMPT, max_tokens=0)
    assert r.status_code == 200
    assert r.json()["choices"][0]["text"] == ""
    assert r.json()["usage"]["completion_tokens"] == 0


def test_a2_streamed_echo_with_prompt_logprobs(gateway, fake, tokenizer):
    status, events = stream(gateway, "/v1/completions", {"model": MODEL_NAME, "prompt": A2_PROMPT, "max_tokens": 0,
                                                         "echo": True, "logprobs": 1, "stream": True})
    assert status == 200
    (chunk,) = events[:-1]
    assert chunk["choices"][0]["text"] == A2_PROMPT
    assert chunk["choices"][0]["logprobs"]["token_logprobs"][0] is None
    assert len(chunk["choices"][0]["logprobs"]["tokens"]) == len(tokenizer.encode(A2_PROMPT))


@pytest.mark.parametrize("n_tokens", [1, 2])
def test_a3_exactly_n_tokens(gateway, fake, tokenizer, n_tokens):
    r = complete(gateway, prompt="def main():", max_tokens=n_tokens, temperature=0, logprobs=1)
    body = r.json()
    choice = body["choices"][0]
    assert body["usage"]["completion_tokens"] == n_tokens
    assert len(choice["logprobs"]["tokens"]) == len(choice["logprobs"]["token_logprobs"]) == n_tokens
    assert choice["finish_reason"] == "length"
    longer = complete(gateway, prompt="def main():", max_tokens=8, temperature=0, logprobs=1).json()
    assert longer["choices"][0]["logprobs"]["tokens"][:n_tokens] == choice["logprobs"]["tokens"]


def test_streamed_logprobs_offsets_continue(gateway, fake, tokenizer):
    status, events = stream(gateway, "/v1/completions", {"model": MODEL_NAME, "prompt": "def", "max_tokens": 6,
                                                         "logprobs": 1, "stream": True})
    whole = complete(gateway, prompt="def", max_tokens=6, logprobs=1).json()["choices"][0]["logprobs"]
    offsets = [o for e in events[:-1] if e["choices"][0]["logprobs"] for o in e["choices"][0]["logprobs"]["text_offset"]]
    tokens = [t for e in events[:-1] if e["choices"][0]["logprobs"] for t in e["choices"][0]["logprobs"]["tokens"]]
    assert offsets == whole["text_offset"]
    assert tokens == whole["tokens"]
