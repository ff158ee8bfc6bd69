"""A prepared eager extend launched behind the extend ahead of it, before that one's commit
(``worker_svc/extend_behind.py``, ``Engine._extend_behind``; on the CPU a launch computes at once): the same tokens
and tables as extends run one by one, committed in order; when the extend ahead fails the one behind is ABORTED
and commits nothing, and the worker serves the next Forward; a decode that follows an enqueued extend takes its
turn and sees that extend's commit; with the flag off nothing is launched behind."""

from __future__ import annotations

import threading

import pytest

from tests.worker.helpers import make_engine
from tests.worker.test_extend_ahead import _batches, _tokens
from tests.worker.test_multistep_in_flight import WAIT_S, _started
from worker_svc import engine as engine_mod
from worker_svc.extend_behind import EnqueuedExtend
from worker_svc.types import ForwardItem, WorkerError


class HeldWait:
    """Holds the first enqueued extend in ``wait()`` (launched, the lock free, not committed) until released."""

    def __init__(self, monkeypatch):
        self.release, self.inside = threading.Event(), threading.Event()
        self.first = True
        wait = EnqueuedExtend.wait

        def held(steps):
            if self.first:
                self.first = False
                self.inside.set()
                assert self.release.wait(WAIT_S), "the first extend was never released"
            return wait(steps)

        monkeypatch.setattr(EnqueuedExtend, "wait", held)


def _until(cond) -> bool:
    ev = threading.Event()
    for _ in range(int(WAIT_S / 0.01)):
        if cond():
            return True
        ev.wait(0.01)
    return False


def _reference(model_dir, batches):
    ref = make_engine(model_dir)
    ref.extend_ahead = False
    return [_tokens(ref.forward(b, "epoch-1")) for b in batches], ref


def _chain(model_dir, b1, b2, monkeypatch):
    """Extend 1 held after its launch; extend 2 (after_seq 1) sent meanwhile. Returns (threads, outs, engine, held)."""
    eng = make_engine(model_dir)
    held = HeldWait(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(b1, "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(b2, "epoch-1", seq=2, after_seq=1))
    return (t1, t2), (out1, out2), eng, held


def test_an_extend_launched_behind_gives_the_tokens_and_tables_of_extends_run_one_by_one(model_dir, prompts,
                                                                                        monkeypatch):
    b1, b2 = _batches(prompts)
    want, ref = _reference(model_dir, (b1, b2))
    (t1, t2), (out1, out2), eng, held = _chain(model_dir, b1, b2, monkeypatch)
    assert _until(lambda: eng.extends_behind == 1), "extend 2 was not launched behind extend 1"
    t2.join(0.2)
    assert t2.is_alive() and "result" not in out2  # launched, but it answers after extend 1's commit
    assert "r2" not in eng.requests
    held.release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    assert "error" not in out1 and "error" not in out2, (out1.get("error"), out2.get("error"))
    assert [_tokens(out1["result"]), _tokens(out2["result"])] == want
    assert out2["result"].device_seconds >= 0 and eng.pending.entries == []
    for rid, state in ref.requests.items():
        got = eng.requests[rid]
        assert (list(got.slots), got.tokens, got.last_token) == (list(state.slots), state.tokens, state.last_token)
    assert eng.requests["r0"].created_seq == 1 and eng.requests["r2"].created_seq == 2
    # the worker serves the next Forward: r0's first decode step from its kept token
    nxt = eng.forward([ForwardItem("r0", (), len(prompts[0]), (1000,), input_from_last_sample=True)], "epoch-1",
                      seq=3, after_seq=2)
    assert nxt.outputs[0].sampled


def test_an_extend_that_arrives_before_the_one_ahead_is_launched_behind_it_once_that_one_is_enqueued(
        model_dir, prompts, monkeypatch):
    b1, b2 = _batches(prompts)
    want, _ = _reference(model_dir, (b1, b2))
    eng = make_engine(model_dir)
    held = HeldWait(monkeypatch)
    t2, out2 = _started(lambda: eng.forward(b2, "epoch-1", seq=2, after_seq=1))  # extend 1 has not arrived yet
    t2.join(0.2)
    assert t2.is_alive() and eng.extends_behind == 0
    t1, out1 = _started(lambda: eng.forward(b1, "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    assert _until(lambda: eng.extends_behind == 1), "extend 2 was not launched behind extend 1 once it was enqueued"
    held.release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    assert [_tokens(out1["result"]), _tokens(out2["result"])] == want


def test_when_the_extend_ahead_fails_the_one_behind_is_aborted_and_commits_nothing(model_dir, prompts, monkeypatch):
    b1, b2 = _batches(prompts)
    (t1, t2), (out1, out2), eng, held = _chain(model_dir, b1, b2, monkeypatch)
    assert _until(lambda: eng.extends_behind == 1)
    commit = engine_mod.Engine.commit
    monkeypatch.setattr(engine_mod.Engine, "commit", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("device lost")))
    held.release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    assert isinstance(out1.get("error"), RuntimeError)
    assert isinstance(out2.get("error"), WorkerError) and out2["error"].code == "ABORTED"
    assert eng.requests == {} and eng.pending.entries == []
    monkeypatch.setattr(engine_mod.Engine, "commit", commit)
    want, _ = _reference(model_dir, (b2,))
    assert _tokens(eng.forward(b2, "epoch-1", seq=3)) == want[0]  # its slots were never committed: sent again


def test_a_decode_after_an_enqueued_extend_takes_its_turn_and_sees_its_commit(model_dir, prompts, monkeypatch):
    b1, _ = _batches(prompts)
    at = 4000
    decode = [ForwardItem(it.request_id, (), len(it.input_ids), (at + i,), input_from_last_sample=True)
              for i, it in enumerate(b1)]
    ref = make_engine(model_dir)
    ref.extend_ahead = False
    ref.forward(b1, "epoch-1")
    want = _tokens(ref.forward(decode, "epoch-1"))
    eng = make_engine(model_dir)
    held = HeldWait(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(b1, "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(decode, "epoch-1", seq=2, after_seq=1))
    t2.join(0.2)
    assert t2.is_alive() and eng.extends_behind == 0
    held.release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    assert "error" not in out2, out2.get("error")
    assert _tokens(out2["result"]) == want


@pytest.mark.parametrize("flag", ["extend_behind", "extend_ahead"])
def test_with_the_flag_off_nothing_is_launched_behind(model_dir, prompts, monkeypatch, flag):
    b1, b2 = _batches(prompts)
    want, _ = _reference(model_dir, (b1, b2))
    eng = make_engine(model_dir)
    setattr(eng, flag, False)
    held = HeldWait(monkeypatch) if flag == "extend_behind" else None
    t1, out1 = _started(lambda: eng.forward(b1, "epoch-1", seq=1))
    if held is not None:
        assert held.inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(b2, "epoch-1", seq=2, after_seq=1))
    if held is not None:
        t2.join(0.2)
        held.release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    assert [_tokens(out1["result"]), _tokens(out2["result"])] == want
    assert eng.extends_behind == 0


# Three extends chained: shared with tests/worker/test_gpu_extend_behind.py, which runs them on CUDA (``make(ahead)``
# builds an engine with ``extend_ahead`` as given; the reference runs them one by one).

def _fresh_lp(rid: str, prompt, at: int) -> ForwardItem:
    return ForwardItem(rid, tuple(prompt), 0, tuple(range(at, at + len(prompt))), has_prefix=True, return_logprob=True)


def _three(prompts):
    """Three extend batches of fresh prompts, slots disjoint: [r0, r1], [r2, r3], [r4, r5, r6]; and the next free slot."""
    at, out = 1, []
    for group in ((0, 1), (2, 3), (4, 5, 6)):
        out.append([_fresh_lp(f"r{i}", prompts[i], at + sum(len(prompts[j]) for j in group if j < i)) for i in group])
        at += sum(len(prompts[i]) for i in group)
    return out, at


def _seen(result):
    return [(o.next_token_id, round(o.logprob, 4)) for o in result.outputs]


def _three_reference(make, prompts):
    batches, at = _three(prompts)
    ref = make(False)
    return batches, at, [_seen(ref.forward(b, "epoch-1", seq=i + 1)) for i, b in enumerate(batches)], ref


def _check_three(eng, ref, outs, want, prompts, at):
    """Outputs and request tables equal the reference's; then a decode of all seven: the same tokens."""
    assert all("error" not in o for o in outs), [o.get("error") for o in outs]
    assert [_seen(o["result"]) for o in outs] == want
    assert ref.requests.keys() == eng.requests.keys()
    for rid, state in ref.requests.items():
        got = eng.requests[rid]
        assert (list(got.slots), got.tokens, got.last_token) == (list(state.slots), state.tokens, state.last_token)
    decode = [ForwardItem(f"r{i}", (), len(p), (at + i,), input_from_last_sample=True, return_logprob=True)
              for i, p in enumerate(prompts[:7])]
    assert _seen(eng.forward(decode, "epoch-1", seq=4, after_seq=3)) == _seen(ref.forward(decode, "epoch-1", seq=4))


def three_chained_while_the_first_is_held(make, prompts, monkeypatch):
    """Extend 1 held after its launch; extend 2 launches behind it, then extend 3 behind extend 2 (extend 1 still
    pending); released: the tokens, logprobs and tables of the three run one by one."""
    batches, at, want, ref = _three_reference(make, prompts)
    eng = make(True)
    held = HeldWait(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(batches[0], "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(batches[1], "epoch-1", seq=2, after_seq=1))
    assert _until(lambda: eng.extends_behind == 1), "extend 2 was not launched behind extend 1"
    t3, out3 = _started(lambda: eng.forward(batches[2], "epoch-1", seq=3, after_seq=2))
    assert _until(lambda: eng.extends_behind == 2), "extend 3 was not launched behind extend 2"
    held.release.set()
    for t in (t1, t2, t3):
        t.join(WAIT_S)
    _check_three(eng, ref, (out1, out2, out3), want, prompts, at)


def three_sent_at_once(make, prompts):
    """Three extends sent together, in reverse order of their seq: the same outputs and tables, whatever overlapped."""
    batches, at, want, ref = _three_reference(make, prompts)
    eng = make(True)
    go = threading.Event()

    def send(i):
        assert go.wait(WAIT_S)
        return eng.forward(batches[i], "epoch-1", seq=i + 1, after_seq=i)

    started = [_started(lambda i=i: send(i)) for i in (2, 1, 0)]
    go.set()
    for t, _ in started:
        t.join(WAIT_S)
    _check_three(eng, ref, [out for _, out in reversed(started)], want, prompts, at)


def _cpu(model_dir):
    def make(ahead: bool):
        eng = make_engine(model_dir)
        eng.extend_ahead = ahead
        return eng
    return make


def test_a_third_extend_is_launched_behind_the_second_while_the_first_is_pending(model_dir, prompts, monkeypatch):
    three_chained_while_the_first_is_held(_cpu(model_dir), prompts, monkeypatch)


def test_three_extends_sent_at_once_give_the_outputs_of_extends_run_one_by_one(model_dir, prompts):
    three_sent_at_once(_cpu(model_dir), prompts)
