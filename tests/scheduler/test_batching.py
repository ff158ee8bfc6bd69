"""Continuous batching on the default pool: concurrency, shared prefixes, full hits (case P1)."""

import random

import pytest

from codeserve.v1 import scheduler_pb2

from tests.scheduler import hf
from tests.stack import generate, generate_many


def random_prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(20, 1024) for _ in range(n)]


def test_32_concurrent_mixed_length_requests_each_equal_their_solo_output(backend, model_path):
    rng = random.Random(7)
    lengths = [rng.choice([3, 17, 60, 130, 260, 530, 700]) for _ in range(32)]
    reqs = [dict(input_ids=random_prompt(rng, n), max_new_tokens=rng.choice([1, 5, 12, 20]), ignore_eos=True,
                 return_logprob=True) for n in lengths]
    solo = [generate(backend.scheduler, **r) for r in reqs[:8]]
    backend.scheduler.FlushCache(scheduler_pb2.FlushCacheRequest())
    together = generate_many(backend.scheduler, reqs)
    for i, (r, out) in enumerate(zip(reqs, together)):
        expected, lps = hf.greedy(model_path, r["input_ids"], r["max_new_tokens"], eos=None)
        assert out.token_ids == expected, f"request {i} (prompt {len(r['input_ids'])})"
        assert out.logprobs == pytest.approx(lps, abs=1e-4)
        if i < len(solo):
            assert out.token_ids == solo[i].token_ids
    assert backend.load().batches_completed > 0
    backend.idle_check()


def test_shared_prefix_requests_report_cached_tokens_and_equal_outputs(backend, model_path):
    rng = random.Random(11)
    prefix = random_prompt(rng, 200)
    first = generate(backend.scheduler, input_ids=prefix + [33], max_new_tokens=6, ignore_eos=True)
    assert first.cached_tokens == 0
    reqs = [dict(input_ids=prefix + random_prompt(rng, 1 + i), max_new_tokens=6, ignore_eos=True) for i in range(8)]
    outs = generate_many(backend.scheduler, reqs)
    for r, out in zip(reqs, outs):
        assert 200 <= out.cached_tokens <= len(r["input_ids"]) - 1
        assert out.token_ids == hf.greedy(model_path, r["input_ids"], 6, eos=None)[0]
    load = backend.load()
    assert load.prefix_hit_tokens >= 8 * 200


def test_p1_cache_on_equals_cache_off_and_a_full_hit_recomputes_one_token(backend, model_path, tokenizer):
    backend.idle_check()
    p0 = "import os\nimport sys\n\ndef main():\n"  # page size 1: every length is a whole number of pages
    prompts = [p0, p0, p0 + "    args = sys.argv", p0 + "    path = os.getcwd()", p0 + "    args = sys.argv"]
    kw = dict(max_new_tokens=32, return_logprob=True, ignore_eos=True)
    cached_run = [generate(backend.scheduler, text=p, **kw) for p in prompts]
    ids0 = tokenizer.encode(p0).ids
    assert cached_run[0].cached_tokens == 0
    assert cached_run[1].cached_tokens == len(ids0) - 1          # full hit: the last token is recomputed
    assert cached_run[4].cached_tokens == cached_run[4].prompt_tokens - 1
    assert all(o.cached_tokens <= o.prompt_tokens - 1 for o in cached_run)
    assert cached_run[2].cached_tokens >= len(ids0) - 1
    for p, out in zip(prompts, cached_run):
        backend.scheduler.FlushCache(scheduler_pb2.FlushCacheRequest())
        cold = generate(backend.scheduler, text=p, **kw)                 # nothing cached: "cache off"
        assert cold.cached_tokens == 0
        assert out.token_ids == cold.token_ids
        assert out.logprobs == pytest.approx(cold.logprobs, abs=1e-4)
        expected, lps = hf.greedy(model_path, tokenizer.encode(p).ids, 32, eos=None)
        assert out.token_ids == expected and out.logprobs == pytest.approx(lps, abs=1e-4)
    backend.idle_check()
