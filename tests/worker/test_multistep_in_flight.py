"""A multi-step decode Forward between its enqueued steps and its commit (worker_svc/multistep.py: the engine's lock
is free while the device runs them): a Release RPC meanwhile answers the released row ``skipped``, and every other
Forward waits for the commit before it validates."""

from __future__ import annotations

import threading

from tests.worker.helpers import make_engine
from worker_svc import multistep
from worker_svc.types import ForwardItem

WAIT_S = 10.0
K = 3


def _prefill(eng, prompts):
    """r0, r1, ... prefilled at slots 1.. (in order); returns the next free slot."""
    at = 1
    for i, p in enumerate(prompts):
        eng.forward([ForwardItem(f"r{i}", tuple(p), 0, tuple(range(at, at + len(p))), has_prefix=True)], "epoch-1")
        at += len(p)
    return at


def _decode(prompts, at, step):
    """Forward ``step`` (0, 1, ...) of K from-last decode steps for each prompt's request."""
    return [ForwardItem(f"r{i}", (), len(p) + K * step, tuple(at + (step * len(prompts) + i) * K + j for j in range(K)),
                        decode_steps=K, input_from_last_sample=True) for i, p in enumerate(prompts)]


class Held:
    """Holds the first multi-step Forward's ``wait()`` (its steps enqueued, its commit not done) until released."""

    def __init__(self, monkeypatch):
        self.release, self.inside = threading.Event(), threading.Event()
        self.first = True
        wait = multistep.EnqueuedSteps.wait

        def held_wait(run):
            if self.first:
                self.first = False
                self.inside.set()
                assert self.release.wait(WAIT_S), "the first Forward was never released"
            wait(run)

        monkeypatch.setattr(multistep.EnqueuedSteps, "wait", held_wait)


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


def test_a_request_released_while_its_forward_is_in_flight_is_answered_skipped(model_dir, prompts, monkeypatch):
    ps = prompts[:2]
    eng = make_engine(model_dir)
    at = _prefill(eng, ps)
    held = Held(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(_decode(ps, at, 0), "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    assert eng.release(["r0"]) == 1  # the Release RPC while Forward 1's steps are in flight
    held.release.set()
    t1.join(WAIT_S)
    o = out1["result"].outputs
    assert o[0].skipped and "r0" not in eng.requests
    assert o[1].sampled and len(eng.requests["r1"].slots) == len(ps[1]) + K


def test_other_forwards_wait_for_the_commit(model_dir, prompts, monkeypatch):
    """An extend (no after_seq) and the next decode Forward (after_seq 1) arriving while Forward 1 is held run only
    after its commit; each is validated against the committed table."""
    ps = prompts[:2]
    eng = make_engine(model_dir)
    at = _prefill(eng, ps)
    held = Held(monkeypatch)
    ran: list[str] = []
    launch = eng._launch
    monkeypatch.setattr(eng, "_launch", lambda items, clock, *a: ran.append(items[0].request_id) or launch(items, clock, *a))
    t1, out1 = _started(lambda: eng.forward(_decode(ps, at, 0), "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    p2 = prompts[2]
    new = tuple(range(at + 100, at + 100 + len(p2)))
    te, oute = _started(lambda: eng.forward([ForwardItem("r2", tuple(p2), 0, new, has_prefix=True)], "epoch-1"))
    t2, out2 = _started(lambda: eng.forward(_decode(ps, at, 1), "epoch-1", seq=2, after_seq=1))
    threading.Event().wait(0.3)
    assert te.is_alive() and "r2" not in eng.requests  # waiting for Forward 1's commit
    assert ran == ["r0"] and len(eng.requests["r0"].slots) == len(ps[0])
    held.release.set()
    for t in (t1, te, t2):
        t.join(WAIT_S)
    assert all("error" not in o for o in (out1, oute, out2))
    assert len(eng.requests["r0"].slots) == len(ps[0]) + 2 * K
    assert len(eng.requests["r2"].slots) == len(p2)
