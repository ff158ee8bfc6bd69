"""Extends with continuation rows (a prompt cut at the previous chunk's end: no prefix in the item, the worker holds
or runs its earlier chunk) are prepared at arrival and launched behind the extend ahead of them, their slot tables
read from what the commits ahead will leave (``extend_ahead.PreparedExtend.with_tables``,
``extend_behind.continuation_tables``). Before, such a batch always took its turn: H200 run 25's c256 timeline had
32 gaps of 4-5 ms of idle device between 8,192-token chunks for it. Same tokens, logprobs and tables as the chunks
run one by one; a continuation whose table is not the one it names is not launched behind, and its turn answers the
validation error as before; a continuation that finds another table at its commit is ABORTED and commits nothing."""

from __future__ import annotations

import numpy as np
import pytest

from tests.worker.helpers import make_engine
from tests.worker.test_extend_behind import HeldWait, _cpu, _until
from tests.worker.test_multistep_in_flight import WAIT_S, _started
from worker_svc.extend_ahead import eligible
from worker_svc.extend_behind import EnqueuedExtend, continuation_tables
from worker_svc.sampler import SamplingParams
from worker_svc.types import ForwardItem, WorkerError


def _chunks(prompts):
    """Three extend batches cutting r0 and r2 across chunk ends (slots disjoint, in order):
    [r0 first half (no sample), r1 whole], [r0 rest (continuation), r2 first part (no sample)],
    [r2 rest (continuation), r3 whole]; and the next free slot."""
    at = 1

    def take(n):
        nonlocal at
        out = tuple(range(at, at + n))
        at += n
        return out

    p0, p1, p2, p3 = prompts[:4]
    h0, h2 = len(p0) // 2, len(p2) // 3
    b1 = [ForwardItem("r0", tuple(p0[:h0]), 0, take(h0), has_prefix=True, sample=False, prompt_len=len(p0)),
          ForwardItem("r1", tuple(p1), 0, take(len(p1)), has_prefix=True, return_logprob=True)]
    b2 = [ForwardItem("r0", tuple(p0[h0:]), h0, take(len(p0) - h0), return_logprob=True, prompt_len=len(p0)),
          ForwardItem("r2", tuple(p2[:h2]), 0, take(h2), has_prefix=True, sample=False, prompt_len=len(p2))]
    b3 = [ForwardItem("r2", tuple(p2[h2:]), h2, take(len(p2) - h2), return_logprob=True, prompt_len=len(p2)),
          ForwardItem("r3", tuple(p3), 0, take(len(p3)), has_prefix=True, return_logprob=True)]
    return [b1, b2, b3], at


def _seen(result):
    return [(o.sampled, o.next_token_id, round(o.logprob, 4)) for o in result.outputs]


def _reference(make, batches):
    ref = make(False)
    return [_seen(ref.forward(b, "epoch-1", seq=i + 1)) for i, b in enumerate(batches)], ref


def _same_tables(eng, ref):
    assert ref.requests.keys() == eng.requests.keys()
    for rid, state in ref.requests.items():
        got = eng.requests[rid]
        assert (list(got.slots), got.tokens, got.last_token) == (list(state.slots), state.tokens, state.last_token)


def chained_while_the_first_is_held(make, prompts, monkeypatch):
    """Extend 1 held after its launch; extend 2 (r0's rest) launches behind it, extend 3 (r2's rest, whose first
    part is in extend 2) behind extend 2: the outputs and tables of the three run one by one; then a decode of all."""
    batches, at = _chunks(prompts)
    want, ref = _reference(make, batches)
    eng = make(True)
    held = HeldWait(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(batches[0], "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(batches[1], "epoch-1", seq=2, after_seq=1))
    assert _until(lambda: eng.extends_behind == 1), "the continuation of r0 was not launched behind extend 1"
    t3, out3 = _started(lambda: eng.forward(batches[2], "epoch-1", seq=3, after_seq=2))
    assert _until(lambda: eng.extends_behind == 2), "the continuation of r2 was not launched behind extend 2"
    assert eng.requests == {}  # nothing committed while extend 1 is held
    held.release.set()
    for t in (t1, t2, t3):
        t.join(WAIT_S)
    assert all("error" not in o for o in (out1, out2, out3)), [o.get("error") for o in (out1, out2, out3)]
    assert [_seen(o["result"]) for o in (out1, out2, out3)] == want
    _same_tables(eng, ref)
    decode = [ForwardItem(f"r{i}", (), len(p), (at + i,), input_from_last_sample=True, return_logprob=True)
              for i, p in enumerate(prompts[:4])]
    assert _seen(eng.forward(decode, "epoch-1", seq=4, after_seq=3)) == _seen(ref.forward(decode, "epoch-1", seq=4))


def test_continuations_are_launched_behind_the_extends_that_hold_their_earlier_chunks(model_dir, prompts, monkeypatch):
    chained_while_the_first_is_held(_cpu(model_dir), prompts, monkeypatch)


def test_continuations_at_their_turn_give_the_outputs_of_chunks_run_one_by_one(model_dir, prompts):
    batches, _ = _chunks(prompts)
    want, ref = _reference(_cpu(model_dir), batches)
    eng = make_engine(model_dir)
    got = [_seen(eng.forward(b, "epoch-1", seq=i + 1, after_seq=i)) for i, b in enumerate(batches)]
    assert got == want and eng.extends_prepared == 3 and eng.extends_behind == 0
    _same_tables(eng, ref)


def test_a_release_during_a_continuation_at_its_turn_waits_for_its_commit(model_dir, prompts, monkeypatch):
    """At its turn a batch with a continuation row is enqueued and committed in two parts (so an extend can be
    launched behind it), its requests guarded: a Release of its request that comes between the two (here: while the
    batch waits for its tokens, ``EnqueuedExtend.wait``, with the lock free) waits for its commit, so the batch
    succeeds (r2 created) and the Release then drops r0. (Found by the review of session 27: without the guard that
    Release dropped r0 and the whole batch was ABORTED.)"""
    batches, _ = _chunks(prompts)
    eng = make_engine(model_dir)
    eng.forward(batches[0], "epoch-1", seq=1)  # r0's first half and r1 committed; nothing pending
    wait = EnqueuedExtend.wait
    releases = []

    def release_meanwhile(steps):
        t, out = _started(lambda: eng.release(["r0"]))
        t.join(0.5)  # returns at once unless it waits for the commit
        releases.append((t, out, dict(out)))
        return wait(steps)

    monkeypatch.setattr(EnqueuedExtend, "wait", release_meanwhile)
    t, out = _started(lambda: eng.forward(batches[1], "epoch-1", seq=2, after_seq=1))
    t.join(WAIT_S)
    assert "error" not in out, out.get("error")
    (rt, rout, before_commit), = releases
    assert before_commit == {}  # the Release had not returned while the batch was pending
    rt.join(WAIT_S)
    assert rout == {"result": 1} and "r0" not in eng.requests and "r2" in eng.requests
    assert eng.pending.entries == []


def test_a_continuation_at_its_turn_lets_the_next_one_launch_behind_it(model_dir, prompts, monkeypatch):
    """Extend 2 (r0's rest) takes its turn after extend 1 committed; extend 3 (r2's rest) arrives while it runs and is
    launched behind it, not at its own turn after extend 2's commit. Before, a continuation at its turn ran in one part
    under the lock and the next could not go behind it: run 29's c256 timeline (H100, call 9) had 24 chunks in a row
    each waiting for the one ahead's commit, ~5.5 ms of idle device between each two. Outputs and tables as one by one."""
    batches, _ = _chunks(prompts)
    want, ref = _reference(_cpu(model_dir), batches)
    eng = make_engine(model_dir)
    got = [_seen(eng.forward(batches[0], "epoch-1", seq=1))]
    held = HeldWait(monkeypatch)
    t2, out2 = _started(lambda: eng.forward(batches[1], "epoch-1", seq=2, after_seq=1))
    assert held.inside.wait(WAIT_S), "extend 2 was not enqueued in two parts at its turn"
    t3, out3 = _started(lambda: eng.forward(batches[2], "epoch-1", seq=3, after_seq=2))
    assert _until(lambda: eng.extends_behind == 1), "extend 3 was not launched behind extend 2"
    held.release.set()
    for t in (t2, t3):
        t.join(WAIT_S)
    assert all("error" not in o for o in (out2, out3)), [o.get("error") for o in (out2, out3)]
    assert got + [_seen(o["result"]) for o in (out2, out3)] == want
    _same_tables(eng, ref)


def test_a_continuation_at_the_wrong_position_is_not_launched_behind_and_its_turn_answers_the_error(
        model_dir, prompts, monkeypatch):
    batches, _ = _chunks(prompts)
    bad = list(batches[1])
    r0 = bad[0]
    bad[0] = ForwardItem("r0", r0.input_ids[1:], r0.position_start + 1, r0.slot_ids[1:], prompt_len=r0.prompt_len)
    eng = make_engine(model_dir)
    held = HeldWait(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(batches[0], "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(bad, "epoch-1", seq=2, after_seq=1))
    t2.join(0.3)
    assert t2.is_alive() and eng.extends_behind == 0
    held.release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    assert "error" not in out1
    err = out2.get("error")
    assert isinstance(err, WorkerError) and err.code == "INVALID_ARGUMENT" and "position_start" in err.message
    assert sorted(eng.requests) == ["r0", "r1"] and len(eng.requests["r0"].slots) == r0.position_start
    assert "r2" not in eng.requests and eng.pending.entries == []


def test_a_continuation_of_an_unknown_request_is_answered_not_found_at_its_turn(model_dir, prompts):
    batches, _ = _chunks(prompts)
    eng = make_engine(model_dir)
    with pytest.raises(WorkerError) as e:
        eng.forward(batches[1], "epoch-1", seq=1)
    assert e.value.code == "NOT_FOUND" and eng.requests == {} and eng.extends_prepared == 1


def test_a_continuation_that_finds_another_table_at_its_commit_is_aborted_and_commits_nothing():
    class Fake:
        def __init__(self):
            self.commits = []

        def commit(self, *a, **k):
            self.commits.append(a)

    class State:
        def __init__(self, n):
            self.slots = range(n)

    items = (ForwardItem("a", (5, 6), 0, (1, 2), has_prefix=True, sample=False),
             ForwardItem("b", (7,), 3, (9,), sample=False))
    steps = EnqueuedExtend(items, ((5, 6), (7,)), (), None, None)
    eng = Fake()
    for requests in ({}, {"b": State(2)}):
        with pytest.raises(WorkerError) as e:
            steps.finish(eng, requests)
        assert e.value.code == "ABORTED" and eng.commits == []
    steps.finish(eng, {"b": State(3)})
    assert [c[0].request_id for c in eng.commits] == ["a", "b"]


def test_continuation_tables_follow_the_extends_ahead_in_order():
    class Table:
        def __init__(self, slots):
            self._a = np.asarray(slots, dtype=np.int32)

        def view(self):
            return self._a

    class State:
        def __init__(self, slots):
            self.slots = Table(slots)

    ahead = [EnqueuedExtend((ForwardItem("a", (1,), 2, (7,)),
                             ForwardItem("b", (1, 2), 0, (8, 9), has_prefix=True, sample=False)), ((1,), (1, 2)), (),
                            None, None),
             EnqueuedExtend((ForwardItem("b", (3,), 2, (10,)), ForwardItem("c", (3,), 0, (11,), has_prefix=True)),
                            ((3,), (3,)), (), None, None)]
    want = [ForwardItem(r, (4,), 0, (20 + i,)) for i, r in enumerate("abcd")]
    got = continuation_tables(want, {"a": State([3, 4]), "b": State([99])}, ahead)
    assert {k: v.tolist() for k, v in got.items()} == {"a": [3, 4, 7], "b": [8, 9, 10], "c": [11]}


def test_which_batches_are_prepared_at_arrival():
    fresh = ForwardItem("a", (1,), 0, (1,), has_prefix=True)
    cont = ForwardItem("b", (1,), 3, (2,))
    pen = SamplingParams(temperature=0.7, repetition_penalty=1.2)
    assert eligible([fresh, cont])
    assert eligible([ForwardItem("b", (1,), 3, (2,), sampling=pen, sample=False)])  # penalties read nothing then
    assert not eligible([fresh, ForwardItem("b", (1,), 3, (2,), sampling=pen)])  # they read its token history
    assert not eligible([ForwardItem("b", (1,), 3, (2,), return_prompt_logprobs=True)])
    assert not eligible([ForwardItem("b", (), 3, (2,), input_from_last_sample=True)])
