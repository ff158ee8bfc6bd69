"""Randomized differential test: scheduler-like chunked batches (prompts cut across chunks, retract/re-admission with
has_prefix, decode rows with explicit inputs, mixed sampling) run one by one with extend_ahead=False vs. submitted as a
pipeline (first held, the rest launched behind at depth)."""
from __future__ import annotations

import random
import threading

import pytest

from tests.worker.helpers import make_engine
from tests.worker.test_extend_behind import HeldWait, _until
from tests.worker.test_multistep_in_flight import WAIT_S, _started
from worker_svc.sampler import SamplingParams
from worker_svc.types import ForwardItem

PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.8, seed=123),
    SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=7),
    SamplingParams(temperature=0.7, min_p=0.05),  # unseeded: the engine generator's draw order
    SamplingParams(temperature=0.8, repetition_penalty=1.3, seed=5),  # penalties: a continuation sampling it is not eligible
]


class R:
    def __init__(self, rid, prompt, params, plp, max_new):
        self.rid, self.prompt, self.params, self.plp, self.max_new = rid, list(prompt), params, plp, max_new
        self.tokens: list[int] = []  # tokens written (prompt then generated inputs)
        self.slots: list[int] = []
        self.known = False
        self.last = None  # sampled, not yet written
        self.gen = 0
        self.done = False
        self.retracted_to = None


def build(ref, prompts, rng, n_batches, chunk):
    """Batches built one by one from the reference engine's outputs; returns [(items, release_ids)], [outputs]."""
    nxt = [1]

    def take(n):
        out = tuple(range(nxt[0], nxt[0] + n))
        nxt[0] += n
        return out

    reqs: list[R] = []
    pool = list(prompts)
    vocab = ref.cfg.vocab_size
    batches, outs = [], []
    rc = 0
    for i in range(n_batches):
        # arrivals
        while len([r for r in reqs if not r.done]) < 4 or rng.random() < 0.3:
            p = list(rng.choice(pool))
            if rng.random() < 0.5:
                p = p + [rng.randrange(vocab) for _ in range(rng.randrange(5, 40))]
            plp = rng.random() < 0.1
            reqs.append(R(f"q{rc}", p, rng.choice(PARAMS), plp, rng.randrange(1, 5)))
            rc += 1
            if len(reqs) > 40:
                break
        release = []
        # retracts
        for r in reqs:
            if r.known and not r.done and not r.plp and rng.random() < 0.12:
                r.known = False
                m = rng.randrange(0, len(r.tokens) + 1)
                r.tokens, r.slots = r.tokens[:m], r.slots[:m]
                if r.last is not None and m < len(r.prompt):
                    r.last = None
                if rng.random() < 0.5:
                    release.append(r.rid)
        budget = chunk
        items = []
        for r in reqs:
            if r.done or budget <= 0:
                continue
            pos = len(r.tokens)
            if pos < len(r.prompt):
                n = min(len(r.prompt) - pos, budget)
                ids = tuple(r.prompt[pos:pos + n])
                final = pos + n == len(r.prompt)
                kw = dict(sampling=r.params, sample=final, prompt_len=len(r.prompt),
                          return_logprob=rng.random() < 0.5, top_logprobs_num=rng.choice([0, 0, 3]),
                          return_prompt_logprobs=r.plp)
            elif r.last is not None:
                if rng.random() < 0.3:
                    continue
                n, ids, final = 1, (r.last,), True
                kw = dict(sampling=r.params, sample=True, return_logprob=rng.random() < 0.5,
                          top_logprobs_num=rng.choice([0, 0, 2]))
            else:
                continue
            slots = take(n)
            if r.known:
                it = ForwardItem(r.rid, ids, pos, slots, **kw)
            else:
                it = ForwardItem(r.rid, ids, pos, slots, has_prefix=True, prefix_slot_ids=tuple(r.slots),
                                 prefix_token_ids=tuple(r.tokens), **kw)
            items.append((r, it, ids, slots))
            budget -= n
        if not items:
            continue
        batch = [it for _, it, _, _ in items]
        res = ref.forward(batch, "epoch-1", seq=len(batches) + 1, release_ids=tuple(release))
        batches.append((batch, tuple(release)))
        outs.append(res.outputs)
        for (r, it, ids, slots), o in zip(items, res.outputs):
            r.known = True
            r.tokens += list(ids)
            r.slots += list(slots)
            if o.sampled:
                r.last = o.next_token_id
                r.gen += 1
                if r.gen >= r.max_new:
                    r.done = True
    return batches, outs


def seen(outputs):
    return [(o.request_id, o.sampled, o.next_token_id, round(o.logprob, 3),
             tuple((t, round(l, 3)) for t, l in o.top_logprobs),
             tuple(round(x, 3) for x in o.prompt_logprobs), o.skipped) for o in outputs]


def tables(eng):
    return {rid: (list(s.slots), list(s.tokens), s.last_token) for rid, s in eng.requests.items()}


@pytest.mark.parametrize("seed", range(int(__import__("os").environ.get("FUZZ_N", "6"))))
@pytest.mark.parametrize("chunk", [7, 19])
def test_pipelined_chain_equals_one_by_one(model_dir, prompts, monkeypatch, seed, chunk):
    rng = random.Random(seed * 100 + chunk)
    ref = make_engine(model_dir)
    ref.extend_ahead = False
    batches, want = build(ref, prompts, rng, 14, chunk)
    eng = make_engine(model_dir)
    held = HeldWait(monkeypatch)
    from worker_svc.extend_behind import EnqueuedExtend
    inner = EnqueuedExtend.wait

    def slow(steps):
        threading.Event().wait(0.05)  # every extend stays pending a while: followers get to launch behind it
        return inner(steps)

    monkeypatch.setattr(EnqueuedExtend, "wait", slow)
    threads = []
    t, out = _started(lambda: eng.forward(batches[0][0], "epoch-1", seq=1, release_ids=batches[0][1]))
    threads.append((t, out))
    ev0 = threading.Event()
    for _ in range(500):
        if held.inside.is_set() or not t.is_alive():
            break
        ev0.wait(0.01)
    for k in range(1, len(batches)):
        b, rel = batches[k]
        t, out = _started(lambda b=b, rel=rel, k=k: eng.forward(b, "epoch-1", seq=k + 1, after_seq=k, release_ids=rel))
        threads.append((t, out))
        ev = threading.Event()
        for _ in range(30):
            if (k + 1) in eng.order._launched or not t.is_alive():
                break
            ev.wait(0.01)
    behind = eng.extends_behind
    held.release.set()
    for t, _ in threads:
        t.join(WAIT_S)
    errs = [(i, o.get("error")) for i, (_, o) in enumerate(threads) if "error" in o]
    assert not errs, errs
    got = [o["result"].outputs for _, o in threads]
    for k, (g, w) in enumerate(zip(got, want)):
        assert seen(g) == seen(w), (k, batches[k])
    assert tables(eng) == tables(ref)
    print(f"seed={seed} chunk={chunk}: {len(batches)} batches, prepared={eng.extends_prepared} behind={behind} final_behind={eng.extends_behind}")
