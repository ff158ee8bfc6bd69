"""Launch ahead (worker_svc/launch_ahead.py): a multi-step decode Forward that continues the one before it
launches its steps before that one's commit, takes its first inputs from that one's tokens on the device, and
gives the tokens a strictly ordered run gives; rows whose request stopped, or was released, in the Forward ahead
are answered ``skipped`` and commit nothing; a failure of the Forward ahead aborts it with nothing committed;
any other Forward waits for the commit."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from tests.worker.helpers import hf_greedy, make_engine
from worker_svc import engine as engine_module
from worker_svc import multistep
from worker_svc.types import ForwardItem, WorkerError

WAIT_S = 10.0
K = 3


def _engine(model_dir):
    """A CPU engine with launch ahead on (the served worker turns it on for CUDA only, when asked)."""
    eng = make_engine(model_dir)
    eng.launch_ahead = True
    return eng


def _prefill(eng, prompts):
    """r0, r1, ... prefilled at slots 1.. (in order); returns the next free slot."""
    at = 1
    for i, p in enumerate(prompts):
        eng.forward([ForwardItem(f"r{i}", tuple(p), 0, tuple(range(at, at + len(p))), has_prefix=True)], "epoch-1")
        at += len(p)
    return at


def _decode(prompts, at, step, rows=None, stops=()):
    """Forward ``step`` (0, 1, ...) of K from-last decode steps for each prompt's request (``rows``: which)."""
    rows = range(len(prompts)) if rows is None else rows
    return [ForwardItem(f"r{i}", (), len(prompts[i]) + K * step,
                        tuple(at + (step * len(prompts) + i) * K + j for j in range(K)), decode_steps=K,
                        input_from_last_sample=True, stop_token_ids=tuple(stops)) for i in rows]


class Gate:
    """Holds the first Forward's ``wait()`` (its steps are enqueued, its commit not done) until released, and
    records the ``ahead`` every launch was given."""

    def __init__(self, monkeypatch):
        self.release = threading.Event()
        self.aheads: list = []
        self.first = True
        launch, wait = multistep.launch_multistep, multistep.LaunchedSteps.wait

        def launch_spy(engine, items, clock, ahead=None, **kw):
            self.aheads.append(ahead)
            return launch(engine, items, clock, ahead, **kw)

        def held_wait(run):
            if self.first:
                self.first = False
                assert self.release.wait(WAIT_S), "the Forward ahead was never released"
            wait(run)

        monkeypatch.setattr("worker_svc.engine.launch_multistep", launch_spy)
        monkeypatch.setattr(multistep.LaunchedSteps, "wait", held_wait)

    def wait_launches(self, n: int) -> None:
        """Polls (up to WAIT_S) until ``n`` launches were seen; the caller asserts on what they were given."""
        for _ in range(int(WAIT_S * 20)):
            if len(self.aheads) >= n:
                return
            threading.Event().wait(0.05)


def _started(fn):
    out: dict = {}

    def run():
        try:
            out["result"] = fn()
        except BaseException as e:  # handed to the test thread, which asserts on it
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_the_next_forward_launches_before_the_commit_and_equals_transformers(model_dir, prompts, hf_model, monkeypatch):
    """Forward 2 (after_seq 1) launches while Forward 1 is held between its launch and its commit (red before
    launch ahead: it waited for Forward 1's commit, which never came); both give transformers' greedy tokens."""
    ps = prompts[:3]
    eng = _engine(model_dir)
    at = _prefill(eng, ps)
    firsts = [eng.requests[f"r{i}"].last_token for i in range(len(ps))]
    gate = Gate(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(_decode(ps, at, 0), "epoch-1", seq=1))
    t2, out2 = _started(lambda: eng.forward(_decode(ps, at, 1), "epoch-1", seq=2, after_seq=1))
    gate.wait_launches(2)  # Forward 2 launches while Forward 1 is still held
    assert len(gate.aheads) == 2 and gate.aheads[1] is not None, "Forward 2 did not launch ahead of the commit"
    assert t1.is_alive() and len(eng.requests["r0"].slots) == len(ps[0])  # nothing committed yet
    gate.release.set()
    t1.join(WAIT_S)
    t2.join(WAIT_S)
    assert "error" not in out1 and "error" not in out2
    for i, p in enumerate(ps):
        got = [firsts[i]] + list(out1["result"].outputs[i].next_token_ids) + list(out2["result"].outputs[i].next_token_ids)
        assert got == hf_greedy(hf_model, p, 1 + 2 * K)[0]
        assert len(eng.requests[f"r{i}"].slots) == len(p) + 2 * K
        assert eng.requests[f"r{i}"].tokens == list(p) + got[:-1]


def test_a_row_stopped_in_the_forward_ahead_is_skipped_and_commits_nothing(model_dir, prompts, monkeypatch):
    """r0 stops at its first step of Forward 1 (its stop id is the token it samples there): Forward 2, launched
    ahead, answers r0 ``skipped`` and commits nothing for it; r1 continues as in an ordered run."""
    ps = prompts[:2]
    ref = make_engine(model_dir)
    at = _prefill(ref, ps)
    ref_first = ref.forward(_decode(ps, at, 0), "epoch-1").outputs
    stop = ref_first[0].next_token_ids[0]
    ref_second = ref.forward(_decode(ps, at, 1, rows=[1]), "epoch-1").outputs[0].next_token_ids

    eng = _engine(model_dir)
    _prefill(eng, ps)
    gate = Gate(monkeypatch)
    first = _decode(ps, at, 0)
    first[0] = dataclasses.replace(first[0], stop_token_ids=(stop,))
    t1, out1 = _started(lambda: eng.forward(first, "epoch-1", seq=1))
    t2, out2 = _started(lambda: eng.forward(_decode(ps, at, 1), "epoch-1", seq=2, after_seq=1))
    gate.wait_launches(2)
    gate.release.set()
    t1.join(WAIT_S)
    t2.join(WAIT_S)
    o1, o2 = out1["result"].outputs, out2["result"].outputs
    assert gate.aheads[1] is not None
    assert o1[0].next_token_ids == (stop,) and eng.requests["r0"].stopped
    assert o2[0].skipped and not o2[0].sampled
    assert len(eng.requests["r0"].slots) == len(ps[0]) + 1  # its input of Forward 1 only
    assert o2[1].next_token_ids == ref_second
    assert len(eng.requests["r1"].slots) == len(ps[1]) + 2 * K


def test_a_failure_of_the_forward_ahead_aborts_the_next_with_nothing_committed(model_dir, prompts, monkeypatch):
    ps = prompts[:2]
    eng = _engine(model_dir)
    at = _prefill(eng, ps)
    gate = Gate(monkeypatch)
    real_finish = multistep.LaunchedSteps.finish
    calls = []

    def failing_finish(run, engine, requests):
        calls.append(run)
        if len(calls) == 1:
            raise RuntimeError("device fault while reading back Forward 1")
        return real_finish(run, engine, requests)

    monkeypatch.setattr(multistep.LaunchedSteps, "finish", failing_finish)
    t1, out1 = _started(lambda: eng.forward(_decode(ps, at, 0), "epoch-1", seq=1))
    t2, out2 = _started(lambda: eng.forward(_decode(ps, at, 1), "epoch-1", seq=2, after_seq=1))
    gate.wait_launches(2)
    gate.release.set()
    t1.join(WAIT_S)
    t2.join(WAIT_S)
    assert isinstance(out1.get("error"), RuntimeError)
    err = out2.get("error")
    assert isinstance(err, WorkerError) and err.code == "ABORTED" and "after seq 1, which failed" in err.message
    assert len(calls) == 1  # Forward 2 never committed
    for i, p in enumerate(ps):
        assert len(eng.requests[f"r{i}"].slots) == len(p)
    assert not eng._pending._launched  # nothing left pending: the next Forward may run
    again = eng.forward(_decode(ps, at, 0), "epoch-1", seq=3)
    assert all(o.sampled for o in again.outputs)


def test_a_request_released_while_its_forward_is_in_flight_is_answered_skipped(model_dir, prompts, monkeypatch):
    ps = prompts[:2]
    eng = _engine(model_dir)
    at = _prefill(eng, ps)
    gate = Gate(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(_decode(ps, at, 0), "epoch-1", seq=1))
    gate.wait_launches(1)
    assert eng.release(["r0"]) == 1  # the Release RPC while Forward 1's steps are in flight
    gate.release.set()
    t1.join(WAIT_S)
    o = out1["result"].outputs
    assert o[0].skipped and "r0" not in eng.requests
    assert o[1].sampled and len(eng.requests["r1"].slots) == len(ps[1]) + K


@pytest.mark.parametrize("launch_ahead", [True, False])
def test_other_forwards_wait_for_the_commit(model_dir, prompts, monkeypatch, launch_ahead):
    """An extend (no after_seq) arriving while Forward 1 is held runs only after its commit, and so does
    Forward 2 when launch ahead is off; each is validated against the committed table."""
    ps = prompts[:2]
    eng = make_engine(model_dir)
    eng.launch_ahead = launch_ahead
    at = _prefill(eng, ps)
    gate = Gate(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(_decode(ps, at, 0), "epoch-1", seq=1))
    gate.wait_launches(1)
    p2 = prompts[2]
    new = tuple(range(at + 100, at + 100 + len(p2)))
    te, oute = _started(lambda: eng.forward([ForwardItem("r2", tuple(p2), 0, new, has_prefix=True)], "epoch-1"))
    t2, out2 = _started(lambda: eng.forward(_decode(ps, at, 1), "epoch-1", seq=2, after_seq=1))
    threading.Event().wait(0.3)
    assert te.is_alive() and "r2" not in eng.requests  # waiting for Forward 1's commit
    assert len(gate.aheads) == (2 if launch_ahead else 1)
    gate.release.set()
    for t in (t1, te, t2):
        t.join(WAIT_S)
    assert all("error" not in o for o in (out1, oute, out2))
    assert len(eng.requests["r0"].slots) == len(ps[0]) + 2 * K
    assert len(eng.requests["r2"].slots) == len(p2)


def test_an_extend_inserted_ahead_while_the_next_forward_waits_for_the_last_step_runs_first(model_dir, prompts,
                                                                                         monkeypatch):
    """Forward 2 (after 1) waits until the device reached Forward 1's last step before it launches; an extend of
    a new request sent meanwhile with before_seq 2 runs right after Forward 1, ahead of Forward 2 (red when
    Forward 2 launched as soon as Forward 1's steps were enqueued: it took the extend's place)."""
    ps = prompts[:2]
    eng = _engine(model_dir)
    at = _prefill(eng, ps)
    gate = Gate(monkeypatch)
    near_go, in_near = threading.Event(), threading.Event()
    real_near = multistep.LaunchedSteps.wait_near

    def held_near(run):
        in_near.set()
        assert near_go.wait(WAIT_S)
        real_near(run)

    monkeypatch.setattr(multistep.LaunchedSteps, "wait_near", held_near)
    ran: list[str] = []
    launch = eng._launch
    monkeypatch.setattr(eng, "_launch", lambda items, known, clock, ahead, **kw: ran.append(items[0].request_id)
                        or launch(items, known, clock, ahead, **kw))
    t1, out1 = _started(lambda: eng.forward(_decode(ps, at, 0), "epoch-1", seq=1))
    t2, out2 = _started(lambda: eng.forward(_decode(ps, at, 1), "epoch-1", seq=2, after_seq=1))
    assert in_near.wait(WAIT_S)  # Forward 2 waits for Forward 1's last step
    p2 = prompts[2]
    extend = ForwardItem("r2", tuple(p2), 0, tuple(range(at + 100, at + 100 + len(p2))), has_prefix=True)
    te, oute = _started(lambda: eng.forward([extend], "epoch-1", seq=3, after_seq=1, before_seq=2))
    threading.Event().wait(0.2)
    near_go.set()
    threading.Event().wait(0.2)
    assert ran == ["r0"]  # Forward 2 did not launch: the extend inserted ahead of it waits for Forward 1
    gate.release.set()
    for t in (t1, te, t2):
        t.join(WAIT_S)
    assert all("error" not in o for o in (out1, oute, out2))
    assert ran == ["r0", "r2", "r0"]
    assert len(eng.requests["r0"].slots) == len(ps[0]) + 2 * K and len(eng.requests["r2"].slots) == len(p2)


def test_the_forward_ahead_commits_while_the_next_one_enqueues_its_steps(model_dir, prompts, monkeypatch):
    """Enqueuing K steps takes about K - 1 steps of device time (each plan waits for the step before it to
    start), so the table lock is given back before the steps are enqueued: Forward 1 commits and replies while
    Forward 2 is still in its step loop (red when the launch held the lock throughout: on the H200 Forward 1's
    reply came ~a Forward late, bench/results/h200-run10/call5: c64 16.1k -> 14.2k tok/s)."""
    ps = prompts[:2]
    eng = _engine(model_dir)
    at = _prefill(eng, ps)
    gate = Gate(monkeypatch)
    first_done = threading.Event()
    wrapped = engine_module.launch_multistep  # Gate's spy

    def slow_second(engine, items, clock, ahead=None, unlock=None):
        if ahead is None:
            return wrapped(engine, items, clock, ahead, unlock=unlock)

        def unlock_then_wait():
            unlock()
            gate.release.set()  # Forward 1 may now finish: it must commit while this loop has not started
            assert first_done.wait(WAIT_S), "Forward 1 could not commit while Forward 2 enqueued its steps"

        return wrapped(engine, items, clock, ahead, unlock=unlock_then_wait)

    monkeypatch.setattr("worker_svc.engine.launch_multistep", slow_second)

    def first():
        try:
            return eng.forward(_decode(ps, at, 0), "epoch-1", seq=1)
        finally:
            first_done.set()

    t1, out1 = _started(first)
    t2, out2 = _started(lambda: eng.forward(_decode(ps, at, 1), "epoch-1", seq=2, after_seq=1))
    t1.join(WAIT_S)
    t2.join(WAIT_S)
    assert "error" not in out1 and "error" not in out2, (out1.get("error"), out2.get("error"))
    assert gate.aheads[1] is not None
    assert all(o.sampled for o in out2["result"].outputs)
    assert len(eng.requests["r0"].slots) == len(ps[0]) + 2 * K


@pytest.mark.parametrize("rows1, rows2, step2", [([0, 1], [0, 1], 1), ([0], [1], 0)], ids=["same-rows", "other-rows"])
def test_a_failure_of_the_forward_ahead_before_the_next_takes_its_turn_aborts_it(model_dir, prompts, monkeypatch,
                                                                                  rows1, rows2, step2):
    """Forward 2 passed its wait (Forward 1 launched, no outcome yet), then Forward 1 fails and leaves the pending
    set before Forward 2 takes its turn: Forward 2 fails ABORTED naming Forward 1 and commits nothing (red: it
    found nothing pending, ran against the table Forward 1 never committed: INVALID_ARGUMENT for Forward 1's rows,
    and rows of other requests committed after a Forward that failed)."""
    ps = prompts[:2]
    eng = _engine(model_dir)
    at = _prefill(eng, ps)
    gate = Gate(monkeypatch)
    real_finish, calls = multistep.LaunchedSteps.finish, []

    def failing_finish(run, engine, requests):
        calls.append(run)
        if len(calls) == 1:
            raise RuntimeError("device fault while reading back Forward 1")
        return real_finish(run, engine, requests)

    monkeypatch.setattr(multistep.LaunchedSteps, "finish", failing_finish)
    take_turn = eng._take_turn

    def late_turn(seq, ahead_of, *args, **kw):
        if seq == 2:  # past its wait for Forward 1: Forward 1 fails and leaves the pending set first
            gate.release.set()
            for _ in range(int(WAIT_S * 20)):
                if not eng._pending._launched:
                    break
                threading.Event().wait(0.05)
        return take_turn(seq, ahead_of, *args, **kw)

    monkeypatch.setattr(eng, "_take_turn", late_turn)
    t1, out1 = _started(lambda: eng.forward(_decode(ps, at, 0, rows=rows1), "epoch-1", seq=1))
    t2, out2 = _started(lambda: eng.forward(_decode(ps, at, step2, rows=rows2), "epoch-1", seq=2, after_seq=1))
    t1.join(WAIT_S)
    t2.join(WAIT_S)
    assert isinstance(out1.get("error"), RuntimeError)
    err = out2.get("error")
    assert isinstance(err, WorkerError) and err.code == "ABORTED" and "after seq 1, which failed" in err.message, err
    assert len(calls) == 1  # Forward 2 never committed
    for i, p in enumerate(ps):
        assert len(eng.requests[f"r{i}"].slots) == len(p)
    assert not eng._pending._launched


def test_a_release_riding_on_the_next_forward_does_not_overtake_the_forward_ahead(model_dir, prompts, monkeypatch):
    """Forward 2 (after 1) releases r0, a request of Forward 1: Forward 1 still commits and answers r0 as in an
    ordered run, then r0 is dropped (red: Forward 2 launched ahead and dropped r0 before Forward 1's commit, which
    answered r0 ``skipped``)."""
    ps = prompts[:2]
    ref = make_engine(model_dir)
    at = _prefill(ref, ps)
    ref_first = ref.forward(_decode(ps, at, 0), "epoch-1").outputs
    ref_second = ref.forward(_decode(ps, at, 1, rows=[1]), "epoch-1").outputs[0].next_token_ids

    eng = _engine(model_dir)
    _prefill(eng, ps)
    gate = Gate(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(_decode(ps, at, 0), "epoch-1", seq=1))
    t2, out2 = _started(lambda: eng.forward(_decode(ps, at, 1, rows=[1]), "epoch-1", seq=2, after_seq=1,
                                            release_ids=("r0",)))
    for _ in range(20):  # Forward 2 would launch ahead by now
        if len(gate.aheads) == 2:
            break
        threading.Event().wait(0.05)
    gate.release.set()
    t1.join(WAIT_S)
    t2.join(WAIT_S)
    assert "error" not in out1 and "error" not in out2, (out1.get("error"), out2.get("error"))
    o1, o2 = out1["result"].outputs, out2["result"].outputs
    assert o1[0].sampled and o1[0].next_token_ids == ref_first[0].next_token_ids
    assert o1[1].next_token_ids == ref_first[1].next_token_ids and o2[0].next_token_ids == ref_second
    assert "r0" not in eng.requests and len(eng.requests["r1"].slots) == len(ps[1]) + 2 * K


def test_a_request_the_forward_ahead_creates_anew_is_continued_as_in_an_ordered_run(model_dir, prompts, monkeypatch):
    """Forward 1 carries r1 with has_prefix (its state is created anew at Forward 1's commit, here from the same
    prefix), Forward 2 continues r1: Forward 2 gives the tokens of an ordered run (red: it launched ahead against
    r1's old state and answered r1 ``skipped`` at its finish, which the scheduler takes for a broken worker)."""
    ps = prompts[:2]

    def first_forward(eng, at):
        items = _decode(ps, at, 0)
        p1 = ps[1]
        items[1] = ForwardItem("r1", (eng.requests["r1"].last_token,), len(p1), items[1].slot_ids, decode_steps=K,
                               has_prefix=True, prefix_slot_ids=tuple(eng.requests["r1"].slots),
                               prefix_token_ids=tuple(p1))
        return items

    ref = make_engine(model_dir)
    at = _prefill(ref, ps)
    ref.forward(first_forward(ref, at), "epoch-1")
    ref_second = ref.forward(_decode(ps, at, 1), "epoch-1").outputs

    eng = _engine(model_dir)
    _prefill(eng, ps)
    gate = Gate(monkeypatch)
    items1 = first_forward(eng, at)
    t1, out1 = _started(lambda: eng.forward(items1, "epoch-1", seq=1))
    t2, out2 = _started(lambda: eng.forward(_decode(ps, at, 1), "epoch-1", seq=2, after_seq=1))
    for _ in range(20):  # Forward 2 would launch ahead by now
        if len(gate.aheads) == 2:
            break
        threading.Event().wait(0.05)
    gate.release.set()
    t1.join(WAIT_S)
    t2.join(WAIT_S)
    assert "error" not in out1 and "error" not in out2, (out1.get("error"), out2.get("error"))
    o2 = out2["result"].outputs
    assert [o.next_token_ids for o in o2] == [o.next_token_ids for o in ref_second]
    assert len(eng.requests["r1"].slots) == len(ps[1]) + 2 * K
