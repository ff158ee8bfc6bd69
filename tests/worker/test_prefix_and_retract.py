"""Extend over a cached prefix, chunked extend and retract-and-recompute all equal one full prefill."""

from __future__ import annotations

import pytest

from tests.worker.helpers import Driver, Req, make_engine
from worker_svc.types import ForwardItem

MAX_NEW = 16


def full_prefill_logprobs(engine, prompt):
    """Logits of every prompt position from one pass (prompt logprobs + the sampled token)."""
    it = ForwardItem(request_id="full", input_ids=tuple(prompt), position_start=0,
                     slot_ids=tuple(range(1, 1 + len(prompt))), has_prefix=True, return_prompt_logprobs=True,
                     return_logprob=True)
    (o,) = engine.forward([it], engine.epoch).outputs
    engine.release(["full"])
    return o


@pytest.fixture(scope="module")
def long_prompt(prompts):
    return prompts[2] + prompts[0] + prompts[5]


@pytest.fixture(scope="module")
def reference(model_dir, long_prompt):
    drv = Driver(make_engine(model_dir))
    (r,) = drv.run([Req("ref", long_prompt, MAX_NEW)])
    return r.out, r.logprobs


@pytest.mark.parametrize("split", ["1", "16", "32", "half", "full-1"])
def test_extend_over_cached_prefix_equals_full_prefill(model_dir, long_prompt, reference, split):
    n = len(long_prompt)
    cut = {"1": 1, "16": 16, "32": 32, "half": n // 2, "full-1": n - 1}[split]
    drv = Driver(make_engine(model_dir))
    # a first request computes the prefix KV (as another request whose KV the cache kept)
    (a,) = drv.run([Req("a", long_prompt[:cut], 1)])
    # the second request arrives with that prefix cached: the worker does not know it; has_prefix carries it
    b = Req("b", long_prompt, MAX_NEW)
    b.tokens, b.slots = list(long_prompt[:cut]), list(a.slots[:cut])
    drv.run([b])
    assert b.out == reference[0]
    assert max(abs(x - y) for x, y in zip(b.logprobs, reference[1])) < 1e-4


@pytest.mark.parametrize("chunk", [1, 7, 32])
def test_chunked_extend_equals_one_pass(model_dir, long_prompt, reference, chunk):
    drv = Driver(make_engine(model_dir), chunk=chunk)
    (r,) = drv.run([Req("c", long_prompt, MAX_NEW)])
    assert r.out == reference[0]
    assert max(abs(x - y) for x, y in zip(r.logprobs, reference[1])) < 1e-4


@pytest.mark.parametrize("keep", [None, 0, 10])
def test_decode_after_retract_and_recompute_equals_uninterrupted(model_dir, long_prompt, reference, keep):
    drv = Driver(make_engine(model_dir))
    r = Req("r", long_prompt, MAX_NEW)
    while len(r.out) < 5:
        drv.step([r])
    # retract: the worker forgets it; the cache kept `keep` tokens (None: everything computed)
    drv.retract(r, keep=keep)
    # the recompute goes to fresh slots: scribble over the freed ones first to catch stale reads
    junk = Req("junk", long_prompt[::-1][:40], 1)
    drv.run([junk])
    # recompute: re-sent with has_prefix; prompt + every generated token not in the kept prefix is extended
    # as new input (the last generated one too), and the final chunk samples the next token
    if keep is not None:
        r.prompt = long_prompt + r.out
    drv.run([r])
    assert r.out == reference[0]
    assert max(abs(x - y) for x, y in zip(r.logprobs, reference[1])) < 1e-4


def test_full_hit_minus_one_recomputes_one_token(model_dir, long_prompt):
    eng = make_engine(model_dir)
    full = full_prefill_logprobs(eng, long_prompt)
    n = len(long_prompt)
    first = ForwardItem(request_id="p", input_ids=tuple(long_prompt[:-1]), position_start=0,
                        slot_ids=tuple(range(100, 100 + n - 1)), has_prefix=True, sample=False)
    eng.forward([first], eng.epoch)
    hit = ForwardItem(request_id="q", input_ids=(long_prompt[-1],), position_start=n - 1, slot_ids=(500,),
                      has_prefix=True, prefix_slot_ids=tuple(range(100, 100 + n - 1)),
                      prefix_token_ids=tuple(long_prompt[:-1]), return_logprob=True)
    (o,) = eng.forward([hit], eng.epoch).outputs
    assert o.next_token_id == full.next_token_id
    assert abs(o.logprob - full.logprob) < 1e-4


def test_positions_are_absolute_after_a_hit(model_dir, long_prompt):
    # a worker that restarted positions at 0 for the new tokens would differ from the full pass
    eng = make_engine(model_dir)
    full = full_prefill_logprobs(eng, long_prompt)
    n, cut = len(long_prompt), 20
    eng.forward([ForwardItem(request_id="p", input_ids=tuple(long_prompt[:cut]), position_start=0,
                             slot_ids=tuple(range(200, 200 + cut)), has_prefix=True, sample=False)], eng.epoch)
    eng.forward([ForwardItem(request_id="p", input_ids=tuple(long_prompt[cut:]), position_start=cut,
                             slot_ids=tuple(range(300, 300 + n - cut)), return_logprob=True)], eng.epoch)
    wrong = make_engine(model_dir)
    # the same new tokens placed at positions 0.. (the bug) give other numbers: the check can fail
    (bad,) = wrong.forward([ForwardItem(request_id="x", input_ids=tuple(long_prompt[cut:]), position_start=0,
                                        slot_ids=tuple(range(300, 300 + n - cut)), has_prefix=True,
                                        return_logprob=True)], wrong.epoch).outputs
    assert abs(bad.logprob - full.logprob) > 1e-4  # the suite's logprob equality tolerance (fp32 noise: ~1e-6)
