"""A multi-step Forward's commit held for the Forward coming behind it (``PendingForwards.coming_behind`` / ``hold``,
the worker's ``--hold-commit-ms``): Forward 2 (after_seq 1) arrives while Forward 1 is pending and is still preparing
when Forward 1's steps end. Held, Forward 1's commit waits, Forward 2 launches behind it and both give the tokens of
Forwards run one by one; off (the default), Forward 1 commits at once and Forward 2 takes its turn; a hold that runs
out commits Forward 1 without Forward 2. On the CPU the steps run as they are enqueued; the tests order the threads
with events (Forward 1's wait for its steps, Forward 2's preparation)."""

from __future__ import annotations

import threading

import pytest

from tests.worker.helpers import make_engine
from tests.worker.test_launch_behind import _one_by_one, _tokens
from tests.worker.test_multistep_in_flight import WAIT_S, Held, _decode, _prefill, _started
from worker_svc.engine import Engine


class GatedPrepare:
    """Holds every Forward's ``_prepare_ahead`` that follows another (after_seq > 0) until ``gate`` is set
    (``inside`` is set once one is held there: it registered as coming behind before it)."""

    def __init__(self, monkeypatch):
        self.gate, self.inside = threading.Event(), threading.Event()
        prepare = Engine._prepare_ahead

        def gated(eng, items, after_seq, mark):
            if after_seq > 0:
                self.inside.set()
                assert self.gate.wait(WAIT_S), "the gated preparation was never let go"
            return prepare(eng, items, after_seq, mark)

        monkeypatch.setattr(Engine, "_prepare_ahead", gated)


def _race(model_dir, ps, forwards, monkeypatch, hold_s: float):
    """Forward 1 held before its commit; Forward 2 sent and held in its preparation; Forward 1 let go. Returns
    (out1, out2, whether Forward 1 had finished before Forward 2's preparation was let go, the engine)."""
    eng = make_engine(model_dir)
    eng.hold_commit_s = hold_s
    _prefill(eng, ps)
    held, prep = Held(monkeypatch), GatedPrepare(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(forwards[0], "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(forwards[1], "epoch-1", seq=2, after_seq=1))
    assert prep.inside.wait(WAIT_S)
    held.release.set()
    t1.join(0.5)  # off or run out: Forward 1 commits meanwhile; held (for seconds): it waits for Forward 2
    first_done = not t1.is_alive()
    prep.gate.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    assert not t1.is_alive() and not t2.is_alive()
    return out1, out2, first_done, eng


def test_a_held_commit_lets_the_forward_coming_behind_launch_first(model_dir, prompts, monkeypatch):
    ps = prompts[:3]
    at = len(sum(ps, [])) + 1
    forwards = [_decode(ps, at, 0), _decode(ps, at, 1)]
    want, ref = _one_by_one(model_dir, ps, forwards)
    out1, out2, first_done, eng = _race(model_dir, ps, forwards, monkeypatch, hold_s=WAIT_S)
    assert not first_done, "Forward 1 committed while Forward 2 was still preparing behind it"
    assert [_tokens(out1), _tokens(out2)] == want
    assert (out1["result"].launch, out2["result"].launch) == ("turn", "behind")
    assert eng.prepared_ahead["behind"] == 1
    for rid, state in ref.requests.items():
        got = eng.requests[rid]
        assert (list(got.slots), got.tokens, got.last_token) == (list(state.slots), state.tokens, state.last_token)
    assert not eng.pending and not eng.pending._coming


@pytest.mark.parametrize("hold_s", [0.0, 0.05], ids=["off", "runs-out"])
def test_without_a_hold_or_when_it_runs_out_the_forward_behind_takes_its_turn(model_dir, prompts, monkeypatch, hold_s):
    ps = prompts[:3]
    at = len(sum(ps, [])) + 1
    forwards = [_decode(ps, at, 0), _decode(ps, at, 1)]
    want, _ = _one_by_one(model_dir, ps, forwards)
    out1, out2, first_done, eng = _race(model_dir, ps, forwards, monkeypatch, hold_s=hold_s)
    assert first_done, "Forward 1's commit waited for Forward 2"
    assert [_tokens(out1), _tokens(out2)] == want
    assert (out1["result"].launch, out2["result"].launch) == ("turn", "turn")
    assert eng.prepared_ahead["behind"] == 0
    assert not eng.pending and not eng.pending._coming
