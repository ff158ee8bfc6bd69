"""A chained multi-step decode Forward launched behind the one it follows, before that one's commit
(``Engine._launch_behind``; on the CPU the steps run as they are enqueued, so the launch computes at once): the same
tokens as Forwards run one by one; a row the Forward ahead stops, or that is released meanwhile, is answered
skipped and commits nothing; an extend inserted ahead before the launch still runs first; when the Forward ahead
fails or the caller cancels, it is ABORTED with nothing committed and the worker serves the next Forward."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from tests.worker.helpers import make_engine
from tests.worker.test_multistep_in_flight import K, WAIT_S, Held, _decode, _prefill, _started
from worker_svc import multistep
from worker_svc.engine import Engine
from worker_svc.types import ForwardItem, WorkerError


def _one_by_one(model_dir, ps, forwards):
    """(each Forward's next_token_ids per item, None where skipped; the engine), run one by one."""
    eng = make_engine(model_dir)
    _prefill(eng, ps)
    return [[o.next_token_ids if o.sampled else None for o in eng.forward(f, "epoch-1").outputs] for f in forwards], eng


def _tokens(out):
    assert "error" not in out, out.get("error")
    return [o.next_token_ids if o.sampled else None for o in out["result"].outputs]


def _behind(eng, n=1):
    """Waits until ``n`` Forwards were launched behind another."""
    done = threading.Event()
    for _ in range(int(WAIT_S / 0.01)):
        if eng.prepared_ahead["behind"] >= n:
            done.set()
            break
        done.wait(0.01)
    return done.is_set()


def _chain(model_dir, ps, forwards, monkeypatch, meanwhile=lambda eng: None, release_ids=()):
    """Forward 1 held before its commit; Forward 2 (after_seq 1) sent and launched behind it; ``meanwhile(eng)``;
    then both finish. Returns (their outs, the engine)."""
    eng = make_engine(model_dir)
    _prefill(eng, ps)
    held = Held(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(forwards[0], "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(forwards[1], "epoch-1", seq=2, after_seq=1, release_ids=release_ids))
    assert _behind(eng), f"Forward 2 was not launched behind Forward 1: {eng.prepared_ahead}"
    meanwhile(eng)
    held.release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    return (out1, out2), eng


def test_a_forward_launched_behind_gives_the_tokens_and_tables_of_forwards_run_one_by_one(model_dir, prompts,
                                                                                          monkeypatch):
    ps = prompts[:3]
    at = len(sum(ps, [])) + 1
    forwards = [_decode(ps, at, 0), _decode(ps, at, 1)]
    want, ref = _one_by_one(model_dir, ps, forwards)
    (out1, out2), eng = _chain(model_dir, ps, forwards, monkeypatch)
    assert [_tokens(out1), _tokens(out2)] == want and all(len(t) == K for f in want for t in f)
    for rid, state in ref.requests.items():
        got = eng.requests[rid]
        assert (list(got.slots), got.tokens, got.last_token) == (list(state.slots), state.tokens, state.last_token)
    assert eng.prepared_ahead == {"used": 0, "built_at_launch": 1, "behind": 1}
    assert out2["result"].device_seconds > 0
    # what the Forward timeline logs of them: Forward 2 prepared at arrival and launched behind, Forward 1 neither
    assert (out1["result"].launch, out1["result"].prepared_ns) == ("turn", -1)
    assert out2["result"].launch == "behind" and out2["result"].prepared_ns > 0
    # its marks: prepared and validated at arrival, the wait, the launch behind; no turn of its own
    assert [n for n, _ in out2["result"].marks] == ["locked", "tables", "near_end", "launched", "woke", "committed"]
    assert [n for n, _ in out1["result"].marks] == ["turn", "launched", "woke", "committed"]
    # the worker serves the next chained Forward (after 2) as usual
    (o,) = [eng.forward(_decode(ps, at, 2), "epoch-1", seq=3, after_seq=2)]
    assert all(len(x.next_token_ids) == K for x in o.outputs)


def test_a_row_the_forward_ahead_stops_is_skipped_and_the_others_match(model_dir, prompts, monkeypatch):
    """r0 samples a stop id at Forward 1's first step: Forward 2 (launched behind with r0's row, assuming all of
    Forward 1's steps) answers r0 skipped and commits nothing for it; r1 and r2 are the reference's."""
    ps = prompts[:3]
    at = len(sum(ps, [])) + 1
    plain = [_decode(ps, at, 0), _decode(ps, at, 1)]
    first = _one_by_one(model_dir, ps, plain)[0][0][0][0]
    forwards = [[dataclasses.replace(plain[0][0], stop_token_ids=(first,))] + plain[0][1:], plain[1]]
    want, ref = _one_by_one(model_dir, ps, forwards)
    (out1, out2), eng = _chain(model_dir, ps, forwards, monkeypatch)
    assert [_tokens(out1), _tokens(out2)] == want
    assert want[0][0] == (first,) and want[1][0] is None
    r0 = eng.requests["r0"]
    assert list(r0.slots) == list(ref.requests["r0"].slots) and r0.stopped and len(r0.slots) == len(ps[0]) + 1


def test_a_row_released_while_launched_behind_is_skipped(model_dir, prompts, monkeypatch):
    ps = prompts[:3]
    at = len(sum(ps, [])) + 1
    forwards = [_decode(ps, at, 0), _decode(ps, at, 1)]
    want, _ = _one_by_one(model_dir, ps, forwards)
    (out1, out2), eng = _chain(model_dir, ps, forwards, monkeypatch, meanwhile=lambda e: e.release(["r1"]))
    got1, got2 = _tokens(out1), _tokens(out2)
    assert got1[1] is None and got2[1] is None and "r1" not in eng.requests  # released in both Forwards' flight
    assert [got1[0], got1[2], got2[0], got2[2]] == [want[0][0], want[0][2], want[1][0], want[1][2]]


def test_its_release_ids_are_applied_after_the_commit_ahead(model_dir, prompts, monkeypatch):
    """Forward 2 releases r2 (which it does not run): r2's row in Forward 1 commits (the release comes at Forward 2's
    turn, as without launching behind), then r2 is dropped."""
    ps = prompts[:3]
    at = len(sum(ps, [])) + 1
    forwards = [_decode(ps, at, 0), _decode(ps[:2], at, 1)]
    want, _ = _one_by_one(model_dir, ps, forwards)
    (out1, out2), eng = _chain(model_dir, ps, forwards, monkeypatch, release_ids=["r2"])
    assert [_tokens(out1), _tokens(out2)] == want and "r2" not in eng.requests


def test_an_extend_inserted_ahead_before_the_launch_runs_first(model_dir, prompts, monkeypatch):
    """An extend E (seq 3: after 1, before 2) that reaches the worker before Forward 2: Forward 2 is not launched
    behind Forward 1; the order is 1, E, 2 as without launching behind."""
    ps = prompts[:3]
    at = len(sum(ps, [])) + 1
    forwards = [_decode(ps, at, 0), _decode(ps, at, 1)]
    extra = ForwardItem("new", tuple(ps[2][:5]), 0, tuple(range(3000, 3005)), has_prefix=True)
    want, _ = _one_by_one(model_dir, ps, [forwards[0], [extra], forwards[1]])
    eng = make_engine(model_dir)
    _prefill(eng, ps)
    held = Held(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(forwards[0], "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t3, out3 = _started(lambda: eng.forward([extra], "epoch-1", seq=3, after_seq=1, before_seq=2))
    deadline = threading.Event()
    while 2 not in eng.order._ahead and not deadline.wait(0.01):  # E registered ahead of Forward 2
        pass
    t2, out2 = _started(lambda: eng.forward(forwards[1], "epoch-1", seq=2, after_seq=1))
    held.release.set()
    for t in (t1, t2, t3):
        t.join(WAIT_S)
    assert [_tokens(out1), _tokens(out3), _tokens(out2)] == want
    assert eng.prepared_ahead["behind"] == 0
    assert out2["result"].launch == "turn" and out2["result"].prepared_ns > 0  # prepared ahead, run at its turn


def test_when_the_forward_ahead_fails_it_is_aborted_with_nothing_committed(model_dir, prompts, monkeypatch):
    ps = prompts[:3]
    at = len(sum(ps, [])) + 1
    forwards = [_decode(ps, at, 0), _decode(ps, at, 1)]
    eng = make_engine(model_dir)
    _prefill(eng, ps)
    before = {rid: len(s.slots) for rid, s in eng.requests.items()}
    release, inside = threading.Event(), threading.Event()
    calls = []
    wait = multistep.EnqueuedSteps.wait

    def failing_wait(steps):
        calls.append(steps)
        if len(calls) == 1:  # Forward 1's: the device failed
            inside.set()
            assert release.wait(WAIT_S)
            raise RuntimeError("device fault")
        wait(steps)

    monkeypatch.setattr(multistep.EnqueuedSteps, "wait", failing_wait)
    t1, out1 = _started(lambda: eng.forward(forwards[0], "epoch-1", seq=1))
    assert inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(forwards[1], "epoch-1", seq=2, after_seq=1))
    assert _behind(eng)
    release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    assert isinstance(out1.get("error"), RuntimeError)
    err = out2.get("error")
    assert isinstance(err, WorkerError) and err.code == "ABORTED" and "seq 1" in err.message
    assert {rid: len(s.slots) for rid, s in eng.requests.items()} == before and not eng.pending
    # the worker serves the next Forward (one step decodes of the committed tables)
    items = [ForwardItem(f"r{i}", (), len(p), (4000 + i,), input_from_last_sample=True) for i, p in enumerate(ps)]
    assert all(o.sampled for o in eng.forward(items, "epoch-1", seq=3).outputs)


def test_a_cancelled_forward_launched_behind_is_aborted_with_nothing_committed(model_dir, prompts, monkeypatch):
    ps = prompts[:2]
    at = len(sum(ps, [])) + 1
    forwards = [_decode(ps, at, 0), _decode(ps, at, 1)]
    eng = make_engine(model_dir)
    _prefill(eng, ps)
    held = Held(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(forwards[0], "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(forwards[1], "epoch-1", seq=2, after_seq=1, cancelled=lambda: True))
    assert _behind(eng)
    held.release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    lens = {rid: len(s.slots) for rid, s in eng.requests.items()}
    assert _tokens(out1) and out2["error"].code == "ABORTED"
    assert lens == {f"r{i}": len(p) + K for i, p in enumerate(ps)} and not eng.pending


def test_with_launch_behind_off_nothing_is_launched_behind(model_dir, prompts, monkeypatch):
    ps = prompts[:2]
    at = len(sum(ps, [])) + 1
    forwards = [_decode(ps, at, 0), _decode(ps, at, 1)]
    want, _ = _one_by_one(model_dir, ps, forwards)
    eng = make_engine(model_dir)
    eng.launch_behind = False
    _prefill(eng, ps)
    held = Held(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(forwards[0], "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(forwards[1], "epoch-1", seq=2, after_seq=1))
    t2.join(0.5)  # Forward 2 waits for its turn
    assert t2.is_alive() and eng.prepared_ahead["behind"] == 0
    held.release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    assert [_tokens(out1), _tokens(out2)] == want and eng.prepared_ahead == {"used": 1, "built_at_launch": 1, "behind": 0}


def test_a_forward_naming_itself_as_the_one_it_follows_leaves_the_pending_forward_in_place(model_dir, prompts,
                                                                                          monkeypatch):
    """Review of session 15: a malformed Forward with seq == after_seq == the pending Forward's seq was launched
    behind it, and its INVALID_ARGUMENT dropped both from the pending list (by seq), so another Forward validated
    against the uncommitted table and r0's K/V went one position off. Now it is refused before anything; Forward 1
    stays pending (a one-step decode waits for its commit) and completes."""
    ps = prompts[:2]
    eng = make_engine(model_dir)
    at = _prefill(eng, ps)
    held = Held(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(_decode(ps, at, 0), "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    with pytest.raises(WorkerError) as bad:
        eng.forward(_decode(ps, at, 1), "epoch-1", seq=1, after_seq=1)
    assert bad.value.code == "INVALID_ARGUMENT" and "after itself" in bad.value.message
    assert [s for s, _ in eng.pending.entries] == [1] and eng.prepared_ahead["behind"] == 0
    one = [ForwardItem("r0", (), len(ps[0]) + K, (3900,), input_from_last_sample=True)]
    t3, out3 = _started(lambda: eng.forward(one, "epoch-1"))
    t3.join(0.5)
    assert t3.is_alive(), "a Forward ran while Forward 1 was still uncommitted"
    held.release.set()
    for t in (t1, t3):
        t.join(WAIT_S)
    assert _tokens(out1) and _tokens(out3) and len(eng.requests["r0"].slots) == len(ps[0]) + K + 1


def test_an_explicit_input_row_of_a_request_the_forward_ahead_runs_waits_for_its_turn(model_dir, prompts, monkeypatch):
    """Review of session 15: Forward 2's r0 item has an explicit input id and Forward 1 stops r0 at its last step.
    One by one, Forward 2 runs r0 (an explicit item is never skipped); launched behind it answered r0 skipped. Such
    a batch now takes its turn: the reference's tokens."""
    ps = prompts[:2]
    at = len(sum(ps, [])) + 1
    plain = [_decode(ps, at, 0), _decode(ps, at, 1)]
    last = _one_by_one(model_dir, ps, plain)[0][0][0][-1]
    f1 = [dataclasses.replace(plain[0][0], stop_token_ids=(last,))] + plain[0][1:]
    f2 = [dataclasses.replace(plain[1][0], input_from_last_sample=False, input_ids=(last,))] + plain[1][1:]
    want, ref = _one_by_one(model_dir, ps, [f1, f2])
    eng = make_engine(model_dir)
    _prefill(eng, ps)
    held = Held(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(f1, "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(f2, "epoch-1", seq=2, after_seq=1))
    t2.join(0.5)
    held.release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    assert [_tokens(out1), _tokens(out2)] == want and want[1][0] is not None
    assert list(eng.requests["r0"].slots) == list(ref.requests["r0"].slots)
    assert eng.prepared_ahead["behind"] == 0


def test_the_launch_lead_is_a_step_count_or_auto(model_dir):
    """``launch_lead_steps`` < 0 is refused by the engine and by the worker's command line; 0 is auto
    (``multistep.lead_steps``: 2 above 64 rows, 1 at or below; a fixed lead is used at every size)."""
    eng = make_engine(model_dir)
    with pytest.raises(ValueError, match="launch_lead_steps must be >= 0"):
        Engine(eng.cfg, eng.model, eng.kv_pool, eng.backend, epoch="epoch-1", launch_lead_steps=-1)
    from worker_svc.__main__ import parse_args
    with pytest.raises(SystemExit):
        parse_args(["--model-path", str(model_dir), "--launch-lead-steps", "-1"])
    assert parse_args(["--model-path", str(model_dir)]).launch_lead_steps == 1
    assert parse_args(["--model-path", str(model_dir), "--launch-lead-steps", "0"]).launch_lead_steps == 0
    from worker_svc.multistep import lead_steps
    assert [lead_steps(0, rows) for rows in (1, 64, 65, 256)] == [1, 1, 2, 2]
    assert [lead_steps(3, rows) for rows in (1, 256)] == [3, 3]


class _Event:
    """Stands for the Forward ahead's ``near_end`` CUDA event on the CPU: ``synchronize()`` runs ``fn`` once (what
    happens while a Forward launched behind waits for the device)."""

    def __init__(self, fn):
        self.fn = fn

    def synchronize(self):
        fn, self.fn = self.fn, None
        if fn is not None:
            fn()


def _with_near_end(monkeypatch, fn):
    """The first Forward's steps get a ``_Event(fn)`` as ``near_end``."""
    init = multistep.EnqueuedSteps.__init__
    made = []

    def patched(self, *a, **kw):
        init(self, *a, **kw)
        if not made:  # the first Forward's steps only
            made.append(self)
            self.near_end = _Event(fn)

    monkeypatch.setattr(multistep.EnqueuedSteps, "__init__", patched)


def test_a_release_during_the_wait_sends_it_to_its_turn(model_dir, prompts, monkeypatch):
    """A row's request released while Forward 2 waits on the device event (validated before the wait): the check
    after it (``Engine._fits_behind``) sends Forward 2 to its turn, which answers NOT_FOUND."""
    ps = prompts[:3]
    at = len(sum(ps, [])) + 1
    forwards = [_decode(ps, at, 0), _decode(ps, at, 1)]
    eng = make_engine(model_dir)
    _prefill(eng, ps)
    _with_near_end(monkeypatch, lambda: eng.release(["r1"]))
    held = Held(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(forwards[0], "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(forwards[1], "epoch-1", seq=2, after_seq=1))
    time.sleep(1.0)  # Forward 2 waited on the event (the release ran there) and now waits for its turn
    held.release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    assert eng.prepared_ahead["behind"] == 0
    assert isinstance(out2.get("error"), WorkerError) and out2["error"].code == "NOT_FOUND"


def test_a_commit_ahead_during_the_wait_sends_it_to_its_turn(model_dir, prompts, monkeypatch):
    """Forward 1 commits while Forward 2 waits on near_end (its outcome recorded only once Forward 2 decided):
    Forward 2 takes its turn, not a launch behind a committed Forward."""
    ps = prompts[:3]
    at = len(sum(ps, [])) + 1
    forwards = [_decode(ps, at, 0), _decode(ps, at, 1)]
    eng = make_engine(model_dir)
    _prefill(eng, ps)
    held = Held(monkeypatch)
    decided = threading.Event()

    def commit_ahead():
        held.release.set()
        deadline = time.monotonic() + WAIT_S
        while eng.pending and time.monotonic() < deadline:
            time.sleep(0.001)
        assert not eng.pending

    _with_near_end(monkeypatch, commit_ahead)
    wait_for, done = eng.order.wait_for, eng.order.done

    def patched_wait_for(after_seq, seq):
        if seq == 2:
            decided.set()
        return wait_for(after_seq, seq)

    def patched_done(seq, failure=""):
        if seq == 1:
            assert decided.wait(WAIT_S)
        return done(seq, failure)

    monkeypatch.setattr(eng.order, "wait_for", patched_wait_for)
    monkeypatch.setattr(eng.order, "done", patched_done)
    t1, out1 = _started(lambda: eng.forward(forwards[0], "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(forwards[1], "epoch-1", seq=2, after_seq=1))
    for t in (t1, t2):
        t.join(WAIT_S)
    assert "error" not in out1 and "error" not in out2, (out1, out2)
    assert eng.prepared_ahead["behind"] == 0 and out2["result"].launch == "turn"
