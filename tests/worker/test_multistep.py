"""Multi-step decode (ForwardItem.decode_steps > 1): greedy output equals HF token for token whatever the
number of steps per Forward; stop token ids end an item early and only written K/V is committed."""

from __future__ import annotations

import pytest

from tests.worker.helpers import hf_greedy, make_engine
from worker_svc.sampler import SamplingParams
from worker_svc.types import ForwardItem, WorkerError

MAX_NEW = 20


@pytest.fixture(scope="module")
def refs(hf_model, prompts):
    return [hf_greedy(hf_model, p, MAX_NEW) for p in prompts[:4]]


def _run(engine, prompts, steps_of, stop_of=lambda i: (), max_new=MAX_NEW):
    """Prefill every prompt in one batch, then multi-step decode batches until each has max_new tokens
    (or stopped). ``steps_of(i, produced)`` gives request i's decode_steps. Returns (tokens, logprobs)."""
    free = iter(range(1, engine.kv_pool.pool_slots))
    items = [ForwardItem(request_id=f"r{i}", input_ids=tuple(p), position_start=0,
                         slot_ids=tuple(next(free) for _ in p), has_prefix=True, return_logprob=True)
             for i, p in enumerate(prompts)]
    res = engine.forward(items, "epoch-1").outputs
    out = [[o.next_token_id] for o in res]
    lps = [[o.logprob] for o in res]
    pos = [len(p) for p in prompts]
    done = [False] * len(prompts)
    while not all(done):
        batch = []
        for i in range(len(prompts)):
            if done[i]:
                continue
            k = min(steps_of(i, len(out[i])), max_new - len(out[i]))
            batch.append(ForwardItem(request_id=f"r{i}", input_ids=(out[i][-1],), position_start=pos[i],
                                     slot_ids=tuple(next(free) for _ in range(k)), decode_steps=k,
                                     stop_token_ids=stop_of(i), return_logprob=True))
        for it, o in zip(batch, engine.forward(batch, "epoch-1").outputs):
            i = int(it.request_id[1:])
            got = o.next_token_ids if it.decode_steps > 1 else (o.next_token_id,)
            got_lp = o.logprobs if it.decode_steps > 1 else (o.logprob,)
            assert o.next_token_id == got[-1]
            pos[i] += len(got)
            assert len(engine.requests[it.request_id].slots) == pos[i]  # K/V committed = tokens returned
            out[i] += got
            lps[i] += got_lp
            done[i] = len(out[i]) >= max_new or (out[i][-1] in stop_of(i))
    return out, lps


@pytest.mark.parametrize("steps", [lambda i, n: 4, lambda i, n: 1 + (i + n) % 5])
def test_multistep_greedy_matches_hf(model_dir, prompts, refs, steps):
    out, lps = _run(make_engine(model_dir), prompts[:4], steps)
    for i, (ref_ids, ref_lps) in enumerate(refs):
        assert out[i] == ref_ids, f"prompt {i}"
        assert max(abs(a - b) for a, b in zip(lps[i], ref_lps)) < 1e-4


def test_stop_token_ends_steps_early(model_dir, prompts, refs):
    ref_ids = refs[0][0]
    stop = ref_ids[5]
    first = ref_ids.index(stop)
    out, _ = _run(make_engine(model_dir), prompts[:1], lambda i, n: 8, stop_of=lambda i: (stop,))
    assert out[0] == ref_ids[: first + 1]


def test_seeded_sampling_does_not_depend_on_steps(model_dir, prompts):
    def sampled(steps):
        eng = make_engine(model_dir)
        p = prompts[0]
        params = SamplingParams(temperature=0.9, top_k=50, seed=1234)
        (o,) = eng.forward([ForwardItem("r0", tuple(p), 0, tuple(range(1, len(p) + 1)), has_prefix=True,
                                        sampling=params)], "epoch-1").outputs
        toks, pos, nxt = [o.next_token_id], len(p), len(p) + 1
        while len(toks) < 12:
            (o,) = eng.forward([ForwardItem("r0", (toks[-1],), pos, tuple(range(nxt, nxt + steps)), sampling=params,
                                            decode_steps=steps)], "epoch-1").outputs
            got = o.next_token_ids if steps > 1 else (o.next_token_id,)
            toks += got
            pos += len(got)
            nxt += steps
        return toks[:12]
    assert sampled(1) == sampled(4) == sampled(6)


def test_multistep_rejects_what_it_cannot_do(model_dir, prompts):
    eng = make_engine(model_dir)
    p = prompts[0]
    eng.forward([ForwardItem("r0", tuple(p), 0, tuple(range(1, len(p) + 1)), has_prefix=True)], "epoch-1")
    n = len(p) + 1
    cases = [
        (ForwardItem("r0", (5,), len(p), (n, n + 1), decode_steps=2, sampling=SamplingParams(repetition_penalty=1.2)),
         "penalties"),
        (ForwardItem("r0", (5,), len(p), (n, n + 1, n + 2), decode_steps=2), "3 slot_ids for 2 decode steps"),
        (ForwardItem("r0", (5, 6), len(p), (n, n + 1), decode_steps=2), "decode items only"),
        (ForwardItem("r0", (5,), len(p), (n, n + 1), decode_steps=2, stop_token_ids=(10 ** 6,)), "vocabulary"),
    ]
    for item, reason in cases:
        with pytest.raises(WorkerError, match=reason) as err:
            eng.forward([item], "epoch-1")
        assert err.value.code == "INVALID_ARGUMENT"
    assert len(eng.requests["r0"].slots) == len(p)  # rejected batches changed nothing
