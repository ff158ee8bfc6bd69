"""An eager extend of fresh prompts is validated, laid out and copied when it arrives, outside the engine's lock
(``worker_svc/extend_ahead.py``, ``Engine._prepare_extend``): while the Forward ahead of it runs, so its turn only
plans and launches. Same tokens as at its turn; a batch that validation rejects is not prepared and its turn answers
the same error, changing nothing."""

from __future__ import annotations

import threading

import pytest

from tests.worker.helpers import make_engine
from tests.worker.test_multistep_in_flight import WAIT_S, _started
from worker_svc import engine as engine_mod
from worker_svc import extend_behind, one_step
from worker_svc.extend_ahead import eligible
from worker_svc.types import ForwardItem, WorkerError


def _fresh(rid: str, prompt, at: int) -> ForwardItem:
    """A fresh prompt's extend at slots at, at + 1, ... (its prefix, empty, in the item)."""
    return ForwardItem(rid, tuple(prompt), 0, tuple(range(at, at + len(prompt))), has_prefix=True)


def _batches(prompts):
    """Two extend batches of fresh prompts (slots disjoint): [r0, r1] and [r2, r3]."""
    at, out = 1, []
    for pair in ((0, 1), (2, 3)):
        batch = []
        for i in pair:
            batch.append(_fresh(f"r{i}", prompts[i], at))
            at += len(prompts[i])
        out.append(batch)
    return out


class HeldSample:
    """Holds the first Forward inside its sampling (its model ran, its commit not done, the lock held) until released:
    ``sample`` of a batch run at its turn (``one_step``), ``sample_async`` of a prepared one being enqueued (``extend_behind``)."""

    def __init__(self, monkeypatch):
        self.release, self.inside = threading.Event(), threading.Event()
        self.first = True
        for module, name in ((one_step, "sample"), (extend_behind, "sample_async")):
            monkeypatch.setattr(module, name, self._held(getattr(module, name)))

    def _held(self, fn):
        def held(*a, **k):
            if self.first:
                self.first = False
                self.inside.set()
                assert self.release.wait(WAIT_S), "the first Forward was never released"
            return fn(*a, **k)

        return held


def _tokens(result):
    return [o.next_token_id for o in result.outputs]


def test_an_extend_arriving_while_one_runs_is_prepared_before_its_turn_with_the_same_tokens(model_dir, prompts,
                                                                                          monkeypatch):
    b1, b2 = _batches(prompts)
    ref = make_engine(model_dir)
    ref.extend_ahead = False
    want = [_tokens(ref.forward(b, "epoch-1")) for b in (b1, b2)]
    assert ref.extends_prepared == 0

    eng = make_engine(model_dir)
    held = HeldSample(monkeypatch)
    validated = []  # validations at a turn (under the lock), by batch
    turn_validate = engine_mod.validate_batch
    monkeypatch.setattr(engine_mod, "validate_batch", lambda items, *a: (validated.append(items), turn_validate(items, *a)))
    prepared = threading.Event()
    prepare = eng._prepare_extend

    def watched(items):
        out = prepare(items)
        if items is b2:
            assert held.inside.is_set() and not held.release.is_set(), "Forward 2 was prepared outside Forward 1's run"
            prepared.set()
        return out

    monkeypatch.setattr(eng, "_prepare_extend", watched)
    t1, out1 = _started(lambda: eng.forward(b1, "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(b2, "epoch-1", seq=2, after_seq=1))
    assert prepared.wait(WAIT_S), "Forward 2 was not prepared while Forward 1 held the lock"
    held.release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    for out in (out1, out2):
        assert "error" not in out, out.get("error")
    assert [_tokens(out1["result"]), _tokens(out2["result"])] == want
    assert eng.extends_prepared == 2 and validated == []  # both prepared at arrival; neither validated at its turn
    for rid, p in zip(("r0", "r1", "r2", "r3"), prompts):
        assert eng.requests[rid].tokens == list(p)


@pytest.mark.parametrize("bad", ["slot_zero", "slot_twice", "token_outside"])
def test_a_batch_validation_rejects_is_not_prepared_and_its_turn_raises_the_same_error(model_dir, prompts, bad):
    b1, _ = _batches(prompts)
    first, second = b1
    if bad == "slot_zero":
        second = ForwardItem(second.request_id, second.input_ids, 0, (0,) + second.slot_ids[1:], has_prefix=True)
    elif bad == "slot_twice":
        second = ForwardItem(second.request_id, second.input_ids, 0, (first.slot_ids[0],) + second.slot_ids[1:],
                             has_prefix=True)
    else:
        second = ForwardItem(second.request_id, (10 ** 7,) + second.input_ids[1:], 0, second.slot_ids, has_prefix=True)
    errors = []
    for ahead in (True, False):
        eng = make_engine(model_dir)
        eng.extend_ahead = ahead
        with pytest.raises(WorkerError) as e:
            eng.forward([first, second], "epoch-1", seq=1)
        errors.append((e.value.code, e.value.message))
        assert eng.requests == {} and eng.extends_prepared == 0
        assert _tokens(eng.forward(b1, "epoch-1", seq=2)) == _tokens(make_engine(model_dir).forward(b1, "epoch-1"))
    assert errors[0] == errors[1] and errors[0][0] == "INVALID_ARGUMENT"


def test_a_prepared_extend_behind_a_forward_that_fails_is_aborted_and_commits_nothing(model_dir, prompts, monkeypatch):
    b1, b2 = _batches(prompts)
    eng = make_engine(model_dir)
    held = HeldSample(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(b1, "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(b2, "epoch-1", seq=2, after_seq=1))
    deadline = threading.Event()
    while eng.extends_prepared < 2 and not deadline.wait(0.01):
        pass
    monkeypatch.setattr(engine_mod.Engine, "commit", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("device lost")))
    held.release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    assert isinstance(out1.get("error"), RuntimeError)
    assert isinstance(out2.get("error"), WorkerError) and out2["error"].code == "ABORTED"
    assert "r2" not in eng.requests and "r3" not in eng.requests


def test_only_batches_that_read_no_request_state_but_table_lengths_and_run_eagerly_are_prepared(model_dir, prompts):
    fresh = _fresh("a", prompts[0], 1)
    cont = ForwardItem("a", (5,), len(prompts[0]), (900,))
    assert eligible([fresh])
    assert eligible([fresh, cont])  # a continuation's table is read at its launch (test_extend_continuation.py)
    assert not eligible([ForwardItem("a", fresh.input_ids, 0, fresh.slot_ids, has_prefix=True,
                                     return_prompt_logprobs=True)])
    assert not eligible([])
    eng = make_engine(model_dir)

    class Takes:
        def fits(self, layout):
            return True

    eng.extend_graphs = Takes()  # a captured graph takes every batch: its turn builds what the graph needs
    assert eng._prepare_extend([fresh]) is None
    eng.extend_graphs = None
    assert eng._prepare_extend([fresh]) is not None
