"""Randomized: scheduler-like extend batches whose prompts are cut across chunk ends (continuation rows), with
retracts and re-admissions of the same id (``has_prefix``, a cached prefix of any length, its release riding on the
same batch or not), finished ids released on a later batch and reused by new requests, decode rows with explicit
inputs, prompt logprobs, penalties and seeded, unseeded and greedy sampling with logprobs and top logprobs. Built one
by one on an engine with ``extend_ahead`` off (the reference), then sent as one pipeline to a default engine (every
batch ``after_seq`` the previous one; each enqueued extend pending a while, so followers are launched behind it at
depth): the same outputs and the same request tables."""

from __future__ import annotations

import random
import threading

import pytest

from tests.worker.helpers import make_engine
from tests.worker.test_extend_behind import HeldWait
from tests.worker.test_multistep_in_flight import WAIT_S, _started
from worker_svc.extend_behind import EnqueuedExtend
from worker_svc.sampler import SamplingParams
from worker_svc.types import ForwardItem

PARAMS = (
    SamplingParams(),
    SamplingParams(temperature=0.8, seed=123),
    SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=7),
    SamplingParams(temperature=0.7, min_p=0.05),  # unseeded: the engine generator's draws, in launch order
    SamplingParams(temperature=0.8, repetition_penalty=1.3, seed=5),  # a continuation that samples so: its turn
)


class _Req:
    def __init__(self, rid, prompt, params, plp, max_new):
        self.rid, self.prompt, self.params, self.plp, self.max_new = rid, prompt, params, plp, max_new
        self.tokens: list[int] = []  # written: prompt, then decode inputs
        self.slots: list[int] = []
        self.known = self.done = self.released = False
        self.last = None  # the token sampled last
        self.gen = 0


def _build(ref, prompts, rng, n_batches, chunk):
    """[(items, release_ids)] built one by one from ``ref``'s outputs, and those outputs."""
    at = [1]

    def take(n):
        at[0] += n
        return tuple(range(at[0] - n, at[0]))

    reqs: list[_Req] = []
    batches, outs = [], []
    for _ in range(n_batches):
        release = []
        for r in reqs:  # a finished request is released on a later batch
            if r.done and not r.released and rng.random() < 0.5:
                r.released = True
                release.append(r.rid)
        while len([r for r in reqs if not r.done]) < 4 or (rng.random() < 0.3 and len(reqs) < 40):
            p = list(rng.choice(prompts))
            if rng.random() < 0.5:
                p += [rng.randrange(ref.cfg.vocab_size) for _ in range(rng.randrange(5, 40))]
            reuse = [r for r in reqs if r.done and r.rid not in {q.rid for q in reqs if not q.done}]
            rid = rng.choice(reuse).rid if reuse and rng.random() < 0.3 else f"q{len(reqs)}"
            reqs.append(_Req(rid, p, rng.choice(PARAMS), rng.random() < 0.1, rng.randrange(1, 5)))
        for r in reqs:  # retract, re-admitted with a cached prefix of any length (its release on this batch or none)
            if r.known and not r.done and not r.plp and rng.random() < 0.12:
                r.known = False
                m = rng.randrange(0, len(r.tokens) + 1)
                r.tokens, r.slots = r.tokens[:m], r.slots[:m]
                if m < len(r.prompt):
                    r.last = None
                if rng.random() < 0.5:
                    release.append(r.rid)
        budget, rows = chunk, []
        for r in reqs:
            if r.done or budget <= 0:
                continue
            pos = len(r.tokens)
            if pos < len(r.prompt):
                n = min(len(r.prompt) - pos, budget)
                ids = tuple(r.prompt[pos:pos + n])
                kw = dict(sample=pos + n == len(r.prompt), prompt_len=len(r.prompt), return_prompt_logprobs=r.plp)
            elif r.last is not None and rng.random() < 0.7:
                n, ids, kw = 1, (r.last,), dict(sample=True)
            else:
                continue
            kw.update(sampling=r.params, return_logprob=rng.random() < 0.5, top_logprobs_num=rng.choice((0, 0, 3)))
            slots = take(n)
            prefix = {} if r.known else dict(has_prefix=True, prefix_slot_ids=tuple(r.slots),
                                             prefix_token_ids=tuple(r.tokens))
            rows.append((r, ForwardItem(r.rid, ids, pos, slots, **prefix, **kw)))
            budget -= n
        if not rows:
            continue
        items = [it for _, it in rows]
        res = ref.forward(items, "epoch-1", seq=len(batches) + 1, release_ids=tuple(release))
        batches.append((items, tuple(release)))
        outs.append(res.outputs)
        for (r, it), o in zip(rows, res.outputs):
            r.known = True
            r.tokens += list(it.input_ids)
            r.slots += list(it.slot_ids)
            if o.sampled:
                r.last, r.gen = o.next_token_id, r.gen + 1
                r.done = r.gen >= r.max_new
    return batches, outs


def _seen(outputs):
    return [(o.request_id, o.sampled, o.next_token_id, round(o.logprob, 3),
             tuple((t, round(lp, 3)) for t, lp in o.top_logprobs), tuple(round(x, 3) for x in o.prompt_logprobs),
             o.skipped) for o in outputs]


def _tables(eng):
    return {rid: (list(s.slots), list(s.tokens), s.last_token) for rid, s in eng.requests.items()}


@pytest.mark.parametrize("seed, chunk", [(0, 7), (3, 7), (7, 7), (8, 7), (1, 19), (3, 19)])
def test_a_pipeline_of_cut_prompts_gives_the_outputs_and_tables_of_the_batches_run_one_by_one(
        model_dir, prompts, monkeypatch, seed, chunk):
    rng = random.Random(seed * 100 + chunk)
    ref = make_engine(model_dir)
    ref.extend_ahead = False
    batches, want = _build(ref, prompts, rng, 14, chunk)
    eng = make_engine(model_dir)
    held = HeldWait(monkeypatch)  # the first extend enqueued stays pending until every batch was sent
    pending = EnqueuedExtend.wait

    def slow(steps):  # every extend stays pending a while: the ones sent after it are launched behind it
        threading.Event().wait(0.05)
        return pending(steps)

    monkeypatch.setattr(EnqueuedExtend, "wait", slow)
    sent = []
    for k, (items, rel) in enumerate(batches):
        t, out = _started(lambda items=items, rel=rel, k=k: eng.forward(items, "epoch-1", seq=k + 1, after_seq=k,
                                                                         release_ids=rel))
        sent.append((t, out))
        ev = threading.Event()
        for _ in range(30):  # until it is launched (behind or at its turn), or is waiting for its turn
            if (k + 1) in eng.order._launched or not t.is_alive():
                break
            ev.wait(0.01)
    held.release.set()
    for t, _ in sent:
        t.join(WAIT_S)
    assert not [(k, o.get("error")) for k, (_, o) in enumerate(sent) if "error" in o]
    for k, ((_, out), w) in enumerate(zip(sent, want)):
        assert _seen(out["result"].outputs) == _seen(w), (k, batches[k])
    assert _tables(eng) == _tables(ref)
    assert eng.extends_behind >= 1 and eng.pending.entries == []
