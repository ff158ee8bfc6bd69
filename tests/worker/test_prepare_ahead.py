"""A chained multi-step decode Forward builds its step metadata while the Forward ahead of it is in flight
(``Engine._prepare_ahead``, ``multistep.prepare_rows``), and uses it at its launch only while it still describes
the request table (``Prepared.valid_for``): the same tokens as Forwards run one by one, whether the metadata built
ahead was used or built again (a stop in the Forward ahead, a release meanwhile)."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from tests.worker.helpers import make_engine
from tests.worker.test_multistep_in_flight import K, WAIT_S, Held, _decode, _prefill, _started
from worker_svc import engine as engine_mod
from worker_svc.types import ForwardItem


def _watch_prepare(monkeypatch) -> threading.Event:
    """An event set once a Forward built its metadata ahead (``prepare_rows`` returned inside ``_prepare_ahead``)."""
    done = threading.Event()
    prepare = engine_mod.prepare_rows

    def watched(*a, **k):
        out = prepare(*a, **k)
        done.set()
        return out

    monkeypatch.setattr(engine_mod, "prepare_rows", watched)
    return done


def _reference(model_dir, ps, forwards):
    """next_token_ids of each Forward's items, the Forwards run one by one (nothing in flight)."""
    eng = make_engine(model_dir)
    eng.prepare_ahead = False
    _prefill(eng, ps)
    return [[o.next_token_ids if o.sampled else None for o in eng.forward(f, "epoch-1").outputs] for f in forwards]


def _chained(model_dir, ps, forwards, monkeypatch, meanwhile=lambda eng: None):
    """Forward 1 held in flight; Forward 2 (after_seq 1) sent and its metadata built ahead; ``meanwhile(eng)``; then
    both run. Returns (each Forward's next_token_ids per item, None where skipped; the engine)."""
    eng = make_engine(model_dir)
    _prefill(eng, ps)
    held = Held(monkeypatch)
    prepared = _watch_prepare(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(forwards[0], "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    t2, out2 = _started(lambda: eng.forward(forwards[1], "epoch-1", seq=2, after_seq=1))
    assert prepared.wait(WAIT_S), "Forward 2 did not build its metadata while Forward 1 was in flight"
    meanwhile(eng)
    held.release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    for out in (out1, out2):
        assert "error" not in out, out.get("error")
    return [[o.next_token_ids if o.sampled else None for o in out["result"].outputs] for out in (out1, out2)], eng


def test_the_metadata_built_ahead_is_used_and_gives_the_same_tokens(model_dir, prompts):
    ps = prompts[:3]
    at = len(sum(ps, [])) + 1
    forwards = [_decode(ps, at, 0), _decode(ps, at, 1)]
    want = _reference(model_dir, ps, forwards)
    with pytest.MonkeyPatch.context() as mp:
        got, eng = _chained(model_dir, ps, forwards, mp)
    assert got == want
    assert all(len(t) == K for f in got for t in f)
    assert eng.prepared_ahead == [1, 1]  # Forward 2 launched on what it built ahead; Forward 1 built at its launch


def test_a_stop_in_the_forward_ahead_makes_the_launch_build_again(model_dir, prompts, monkeypatch):
    """r0 samples a stop id at Forward 1's first step: its continuation in Forward 2 is skipped, so the rows built
    ahead no longer match; Forward 2 builds them again and the other rows' tokens are those of the reference."""
    ps = prompts[:3]
    at = len(sum(ps, [])) + 1
    plain = [_decode(ps, at, 0), _decode(ps, at, 1)]
    first = _reference(model_dir, ps, plain)[0][0][0]  # r0's first sampled token
    stop = dataclasses.replace(plain[0][0], stop_token_ids=(first,))
    forwards = [[stop] + plain[0][1:], plain[1]]
    want = _reference(model_dir, ps, forwards)
    got, eng = _chained(model_dir, ps, forwards, monkeypatch)
    assert got == want
    assert got[0][0] == (first,) and got[1][0] is None  # r0 stopped, then skipped
    assert eng.prepared_ahead == [0, 2]


def test_a_state_replaced_meanwhile_makes_the_launch_build_again(model_dir, prompts, monkeypatch):
    """After Forward 2 built its rows ahead, an extend inserted ahead of it (seq 3: after 1, before 2) prefills r1
    again with other tokens at other slots, to the length Forward 2 expects: Forward 2 validates, but the rows built
    ahead read r1's old slots, so its launch builds them again and r1's tokens are those of the reference (Forwards
    1, 3, 2 one by one)."""
    ps = prompts[:3]
    at = len(sum(ps, [])) + 1
    forwards = [_decode(ps, at, 0), _decode(ps, at, 1)]
    n = len(ps[1]) + K  # r1's length after Forward 1
    other = list(reversed(ps[2] * 4))[:n]
    again = ForwardItem("r1", tuple(other), 0, tuple(range(3000, 3000 + n)), has_prefix=True)
    ref = make_engine(model_dir)
    ref.prepare_ahead = False
    _prefill(ref, ps)
    want = [[o.next_token_ids for o in ref.forward(f, "epoch-1").outputs] for f in (forwards[0], [again], forwards[1])]
    threads = []

    def insert(eng):
        threads.append(_started(lambda: eng.forward([again], "epoch-1", seq=3, after_seq=1, before_seq=2)))

    got, eng = _chained(model_dir, ps, forwards, monkeypatch, meanwhile=insert)
    t3, out3 = threads[0]
    t3.join(WAIT_S)
    assert [o.next_token_ids for o in out3["result"].outputs] == want[1]
    assert got == [want[0], want[2]]
    assert eng.prepared_ahead == [0, 2]
