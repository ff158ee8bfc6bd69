"""Continuation rows launched behind (``extend_behind``): a Release RPC of a continued request landing while the chain
is pending ABORTS the continuation behind (nothing of it committed) and the worker serves a re-admission after; the
extend ahead failing ABORTS a chain of continuations at depth 3 and the same chunks sent again give the one-by-one
results; a continuation batch a captured graph takes is not prepared and runs as before."""
from __future__ import annotations

import torch

from tests.worker.helpers import make_engine
from tests.worker.test_extend_behind import HeldWait, _until
from tests.worker.test_extend_continuation import _chunks, _reference, _same_tables, _seen
from tests.worker.test_multistep_in_flight import WAIT_S, _started
from worker_svc.extend_behind import EnqueuedExtend
from worker_svc.types import ForwardItem, WorkerError


def test_a_release_of_a_continued_request_while_its_continuation_is_behind_aborts_only_that_one(
        model_dir, prompts, monkeypatch):
    """r0's first half committed; E1 (r1, fresh) held pending; E2 (r0's rest, continuation, and r3, fresh) launched
    behind it. A Release RPC of r0 while both are pending: E1 commits, E2 is ABORTED with nothing of it committed (r3
    neither); the worker then serves r0 re-admitted with its prefix as a reference engine does."""
    p0, p1 = prompts[0], prompts[1]
    h = len(p0) // 2
    first = [ForwardItem("r0", tuple(p0[:h]), 0, tuple(range(1, 1 + h)), has_prefix=True, sample=False)]
    e1 = [ForwardItem("r1", tuple(p1), 0, tuple(range(100, 100 + len(p1))), has_prefix=True)]
    e2 = [ForwardItem("r0", tuple(p0[h:]), h, tuple(range(1 + h, 1 + len(p0))), return_logprob=True),
          ForwardItem("r3", tuple(p1), 0, tuple(range(200, 200 + len(p1))), has_prefix=True)]
    eng = make_engine(model_dir)
    eng.forward(first, "epoch-1", seq=1)
    held = HeldWait(monkeypatch)
    t1, o1 = _started(lambda: eng.forward(e1, "epoch-1", seq=2, after_seq=1))
    assert held.inside.wait(WAIT_S)
    t2, o2 = _started(lambda: eng.forward(e2, "epoch-1", seq=3, after_seq=2))
    assert _until(lambda: eng.extends_behind == 1)
    assert eng.release(["r0"]) == 1
    held.release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    assert "error" not in o1
    assert isinstance(o2.get("error"), WorkerError) and o2["error"].code == "ABORTED", o2
    assert sorted(eng.requests) == ["r1"] and eng.pending.entries == []
    # the worker keeps serving: r0 re-admitted with its prefix, compare with a reference
    readmit = [ForwardItem("r0", tuple(p0[h:]), h, tuple(range(300, 300 + len(p0) - h)), has_prefix=True,
                           prefix_slot_ids=tuple(range(1, 1 + h)), prefix_token_ids=tuple(p0[:h]), return_logprob=True)]
    got = eng.forward(readmit, "epoch-1", seq=4, after_seq=0)
    ref = make_engine(model_dir)
    ref.extend_ahead = False
    ref.forward(first, "epoch-1")
    want = ref.forward([readmit[0]], "epoch-1")
    assert _seen(got) == _seen(want)


def test_when_the_extend_ahead_fails_a_chain_of_continuations_is_aborted_and_the_worker_serves_on(
        model_dir, prompts, monkeypatch):
    batches, _ = _chunks(prompts)
    eng = make_engine(model_dir)
    held = HeldWait(monkeypatch)
    inner = EnqueuedExtend.finish
    calls = []

    def failing(steps, engine, requests):
        calls.append(steps)
        if len(calls) == 1:
            raise WorkerError("INTERNAL", "boom")
        return inner(steps, engine, requests)

    monkeypatch.setattr(EnqueuedExtend, "finish", failing)
    t1, o1 = _started(lambda: eng.forward(batches[0], "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t2, o2 = _started(lambda: eng.forward(batches[1], "epoch-1", seq=2, after_seq=1))
    assert _until(lambda: eng.extends_behind == 1)
    t3, o3 = _started(lambda: eng.forward(batches[2], "epoch-1", seq=3, after_seq=2))
    assert _until(lambda: eng.extends_behind == 2)
    held.release.set()
    for t in (t1, t2, t3):
        t.join(WAIT_S)
    assert o1["error"].code == "INTERNAL"
    assert o2["error"].code == "ABORTED" and o3["error"].code == "ABORTED", (o2, o3)
    assert eng.requests == {} and eng.pending.entries == []
    # serves on: the same chunks again (new seqs) give the one-by-one results
    ref = make_engine(model_dir)
    ref.extend_ahead = False
    want = [_seen(ref.forward(b, "epoch-1")) for b in batches]
    got = [_seen(eng.forward(b, "epoch-1", seq=10 + i, after_seq=(9 + i) if i else 0)) for i, b in enumerate(batches)]
    assert got == want
    _same_tables(eng, ref)


def test_continuation_batches_a_captured_graph_takes_are_not_prepared_and_give_the_same_outputs(model_dir, prompts):
    batches, _ = _chunks(prompts)
    want, ref = _reference(lambda ahead: _mk(model_dir, ahead), batches)
    eng = _mk(model_dir, True)
    small = [sum(len(it.input_ids) for it in b) <= 12 for b in batches]
    assert True in small and False in small
    got = [_seen(eng.forward(b, "epoch-1", seq=i + 1, after_seq=i)) for i, b in enumerate(batches)]
    assert got == want
    assert eng.extends_prepared == small.count(False), (small, eng.extends_prepared)
    assert eng.extend_graphs.ran == small.count(True)
    _same_tables(eng, ref)


class _FakePieces:
    """An 'extend graph' that takes batches of <= 12 tokens and runs them eagerly (CPU stand-in)."""

    def __init__(self, eng):
        self.eng, self.ran = eng, 0

    def fits(self, layout):
        return layout.num_tokens <= 12

    def run(self, layout, input_ids, backend):
        self.ran += 1
        e = self.eng
        e.plan(layout, eager=True)
        return e.model(input_ids, torch.from_numpy(layout.positions), e.kv_pool, backend,
                       torch.from_numpy(layout.out_slots))


def _mk(model_dir, ahead):
    eng = make_engine(model_dir)
    eng.extend_ahead = ahead
    eng.extend_graphs = _FakePieces(eng)
    return eng

