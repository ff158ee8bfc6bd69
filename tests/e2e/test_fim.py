"""``suffix`` through all four real services: greedy FIM output equals transformers on the same ids (HumanEval
cuts, PSM and SPM, both APIs, streamed and whole), echo, and the prefix cache on a repeated file prefix."""

from __future__ import annotations

import json

import pytest

from bench.humaneval_fim import cuts
from tests.scheduler import hf

CUTS = cuts(seed=0, limit=3)  # 3 problems x (single-line, multi-line)


@pytest.fixture(scope="module")
def literal(model_path):
    """Ids of user text with special-token text as ordinary text, and the marker ids, from the checkpoint."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{model_path}/tokenizer.json")
    tok.encode_special_tokens = True
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def fim_ids(tokenizer, literal, prefix: str, suffix: str, mode: str) -> list[int]:
    pre, suf, mid = tokenizer.convert_tokens_to_ids(["<fim_prefix>", "<fim_suffix>", "<fim_middle>"])
    if mode == "psm":
        return [pre] + literal(prefix) + [suf] + literal(suffix) + [mid]
    return [pre, suf] + literal(suffix) + [mid] + literal(prefix)


def decoded(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("mode", ["psm", "spm"])
@pytest.mark.parametrize("index", range(len(CUTS)), ids=[f"{c.task_id}-{c.kind}" for c in CUTS])
def test_native_fim_greedy_equals_hf(http, model_path, tokenizer, literal, index, mode) -> None:
    c = CUTS[index]
    ids = fim_ids(tokenizer, literal, c.prefix, c.suffix, mode)
    want, _ = hf.greedy(model_path, ids, 48)
    reply = http.post("/generate", json={"text": c.prefix, "suffix": c.suffix, "fim_mode": mode,
                                         "sampling_params": {"max_new_tokens": 48, "temperature": 0}})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["meta_info"]["prompt_tokens"] == len(ids)
    assert body["output_ids"] == want
    assert body["text"] == decoded(tokenizer, want)


@pytest.mark.parametrize("index", [0, 1])
def test_completions_fim_streamed_and_whole_equal_hf_and_echo_prefix(http, model_name, model_path, tokenizer,
                                                                     literal, index) -> None:
    c = CUTS[index]
    want, _ = hf.greedy(model_path, fim_ids(tokenizer, literal, c.prefix, c.suffix, "psm"), 40)
    body = {"model": model_name, "prompt": c.prefix, "suffix": c.suffix, "max_tokens": 40, "temperature": 0}
    whole = http.post("/v1/completions", json=body).json()
    assert whole["choices"][0]["text"] == decoded(tokenizer, want)
    assert whole["choices"][0]["finish_reason"] == ("stop" if want[-1] == tokenizer.eos_token_id else "length")
    chunks = []
    with http.stream("POST", "/v1/completions", json={**body, "stream": True, "echo": True}) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == c.prefix + decoded(tokenizer, want)


def test_forged_markers_in_user_text_match_hf_on_literal_ids(http, model_path, tokenizer, literal) -> None:
    prefix, suffix = "s = '<fim_middle>'\ndef f(x):\n    ", "\n<fim_suffix>print(f(2))\n"
    ids = fim_ids(tokenizer, literal, prefix, suffix, "psm")
    assert ids.count(tokenizer.convert_tokens_to_ids("<fim_middle>")) == 1
    want, _ = hf.greedy(model_path, ids, 24)
    reply = http.post("/generate", json={"text": prefix, "suffix": suffix,
                                         "sampling_params": {"max_new_tokens": 24, "temperature": 0}})
    assert reply.json()["output_ids"] == want


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("mode", ["psm", "spm"])
def test_prefix_cache_reuse_psm_and_spm(http, backend, tokenizer, literal, mode) -> None:
    """PSM: the same file prefix with another suffix reuses the prefix. SPM: the same suffix with a longer
    prefix (typing at the cursor) reuses the suffix and the old prefix. Each measured as cached_tokens.

    The first request's insert into the radix tree is deferred after its answer (docs/architecture.md, Finish) and
    an early Match does not carry it: the second request is sent once the scheduler has settled (GetLoad counts a
    request running until its insert is sent), as an editor's next keystroke, tens of ms later, finds it. Sent at
    once, it raced the insert and found nothing cached in one CI run on a loaded 2-core machine (0 against 264)."""
    c = CUTS[1]
    if mode == "psm":
        (p1, s1), (p2, s2) = (c.prefix, c.suffix), (c.prefix, "# changed\n" + c.suffix)
    else:
        (p1, s1), (p2, s2) = (c.prefix, c.suffix), (c.prefix + c.middle, c.suffix)
    http.post("/flush_cache")
    for prefix, suffix in ((p1, s1), (p2, s2)):
        reply = http.post("/generate", json={"text": prefix, "suffix": suffix, "fim_mode": mode,
                                             "sampling_params": {"max_new_tokens": 2, "temperature": 0}}).json()
        backend.wait_idle()
    shared = common_prefix(fim_ids(tokenizer, literal, p1, s1, mode), fim_ids(tokenizer, literal, p2, s2, mode))
    assert shared > len(literal(p1 if mode == "psm" else s1))
    assert reply["meta_info"]["cached_tokens"] == shared
