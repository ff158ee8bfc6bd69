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
from worker_svc.types import ForwardItem, WorkerError


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


def _one_by_one(model_dir, ps, forwards):
    """(next_token_ids of each Forward's items, None where skipped; the engine), the Forwards run one by one
    (nothing in flight, nothing built ahead)."""
    eng = make_engine(model_dir)
    eng.prepare_ahead = False
    _prefill(eng, ps)
    return [[o.next_token_ids if o.sampled else None for o in eng.forward(f, "epoch-1").outputs] for f in forwards], eng


def _reference(model_dir, ps, forwards):
    """next_token_ids of each Forward's items, the Forwards run one by one (``_one_by_one``)."""
    return _one_by_one(model_dir, ps, forwards)[0]


def _chained(model_dir, ps, forwards, monkeypatch, meanwhile=lambda eng: None):
    """Forward 1 held in flight; Forward 2 (after_seq 1) sent and its metadata built ahead; ``meanwhile(eng)``; then
    both run. Returns (each Forward's next_token_ids per item, None where skipped; the engine). Launch behind is off:
    these tests are about the metadata used at Forward 2's own turn (``test_launch_behind.py`` has the other way)."""
    eng = make_engine(model_dir)
    eng.launch_behind = False
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
    assert eng.prepared_ahead == {"used": 1, "built_at_launch": 1, "behind": 0}  # Forward 2 launched on what it built ahead; Forward 1 built at its launch


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
    assert eng.prepared_ahead == {"used": 0, "built_at_launch": 2, "behind": 0}


def _chained_inserting(model_dir, ps, forwards, monkeypatch, item):
    """``_chained`` with ``item`` sent meanwhile as Forward 3 (after 1, before 2): (tokens, engine, Forward 3's
    result dict, joined)."""
    threads = []

    def insert(eng):
        threads.append(_started(lambda: eng.forward([item], "epoch-1", seq=3, after_seq=1, before_seq=2)))

    got, eng = _chained(model_dir, ps, forwards, monkeypatch, meanwhile=insert)
    t3, out3 = threads[0]
    t3.join(WAIT_S)
    return got, eng, out3


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
    want = _reference(model_dir, ps, [forwards[0], [again], forwards[1]])
    got, eng, out3 = _chained_inserting(model_dir, ps, forwards, monkeypatch, again)
    assert [o.next_token_ids for o in out3["result"].outputs] == want[1]
    assert got == [want[0], want[2]]
    assert eng.prepared_ahead == {"used": 0, "built_at_launch": 2, "behind": 0}


def test_a_stopped_row_refilled_by_an_inserted_forward_is_not_taken_as_valid(model_dir, prompts, monkeypatch):
    """r0 stops at Forward 1's first step (1 of its K slots committed, stopped). An extend E inserted ahead of
    Forward 2 (seq 3: after 1, before 2) writes r0's next K - 1 tokens at other slots, which clears ``stopped`` and
    brings r0 to the length Forward 2 expects. The rows built ahead assumed Forward 1's K slots for r0 (slots 2..K
    hold Forward 1's post-stop K/V, not E's), yet ``valid_for`` holds (same state object, same length, not stopped):
    Forward 2 attends over the wrong K/V. Reference: Forwards 1, E, 2 one by one."""
    ps = prompts[:3]
    at = len(sum(ps, [])) + 1
    plain = [_decode(ps, at, 0), _decode(ps, at, 1)]
    ref1 = _reference(model_dir, ps, plain)[0][0]
    first = ref1[0]  # r0's first sampled token
    forwards = [[dataclasses.replace(plain[0][0], stop_token_ids=(first,))] + plain[0][1:], plain[1]]
    filler = tuple(t for t in ps[2] if t not in ref1)[: K - 1]  # not the tokens Forward 1 wrote after the stop
    e_item = ForwardItem("r0", filler, len(ps[0]) + 1, tuple(range(3000, 3000 + K - 1)))

    want, ref = _one_by_one(model_dir, ps, [forwards[0], [e_item], forwards[1]])
    want_table = list(ref.requests["r0"].slots)

    got, eng, out3 = _chained_inserting(model_dir, ps, forwards, monkeypatch, e_item)
    assert "error" not in out3, out3.get("error")
    assert got[0] == want[0] and got[0][0] == (first,)  # r0 stopped in Forward 1
    assert list(eng.requests["r0"].slots) == want_table  # the committed table: r0's prompt, a0, E's slots, ...
    # the launch must have built the rows again (r0's table is not the one built ahead) and match the reference
    assert got[1] == want[2], f"Forward 2's tokens differ from the reference; prepared_ahead={eng.prepared_ahead}"
    assert eng.prepared_ahead == {"used": 0, "built_at_launch": 2, "behind": 0}, f"Forward 2 launched on metadata built ahead: {eng.prepared_ahead}"


def test_an_invalid_slot_id_is_answered_invalid_argument_and_its_releases_applied(model_dir, prompts, monkeypatch):
    """Forward 2 (after_seq 1, sent while Forward 1 is in flight) names a slot id outside int32 and releases r2.
    Without prepare-ahead validation answers INVALID_ARGUMENT and r2's release rides through; with it,
    ``prepare_rows`` raises OverflowError before the Forward's turn (the servicer's INTERNAL) and r2 stays."""
    ps = prompts[:3]
    at = len(sum(ps, [])) + 1
    f1, f2 = _decode(ps[:2], at, 0), _decode(ps[:2], at + 100, 1)
    f2 = [dataclasses.replace(f2[0], slot_ids=(2 ** 31,) + f2[0].slot_ids[1:])] + f2[1:]
    errors = {}
    for ahead in (False, True):
        eng = make_engine(model_dir)
        eng.prepare_ahead = ahead
        _prefill(eng, ps)
        with pytest.MonkeyPatch.context() as mp:
            held = Held(mp)
            t1, out1 = _started(lambda: eng.forward(f1, "epoch-1", seq=1))
            assert held.inside.wait(WAIT_S)
            t2, out2 = _started(lambda: eng.forward(f2, "epoch-1", seq=2, after_seq=1, release_ids=["r2"]))
            held.release.set()
            for t in (t1, t2):
                t.join(WAIT_S)
        errors[ahead] = (out2.get("error"), "r2" in eng.requests)
    assert isinstance(errors[False][0], WorkerError) and errors[False][0].code == "INVALID_ARGUMENT"
    assert errors[False][1] is False  # released by the rejected Forward, as documented
    err, r2_kept = errors[True]
    assert isinstance(err, WorkerError) and err.code == "INVALID_ARGUMENT", f"with prepare-ahead: {err!r}"
    assert r2_kept is False, "with prepare-ahead the Forward's release_request_ids were not applied"


def test_a_batch_validation_rejects_builds_no_device_metadata(model_dir, prompts, monkeypatch):
    """Forward 2 (after_seq 1, sent while Forward 1 is in flight) has an item of decode_steps far beyond n_positions
    (one slot per step, as the pre-filter of ``_prepare_ahead`` wants); validation rejects it, but on the graphs path
    ``prepare_rows`` first builds its ``StepFeed``, whose index lists grow as decode_steps ** 2 (K = 16,384: 134M
    indices, ~8 s on this CPU; K >= 65,536: past the int32 offsets StepFeed packs them in), on the device, before the
    Forward's turn. (Graphs stubbed so that the CPU engine takes the StepFeed path; the batch never launches.)"""
    import types

    from worker_svc import multistep

    built = []
    monkeypatch.setattr(multistep, "StepFeed", lambda prefixes, new, ks, *a, **k: built.append(max(ks)) or None)
    ps = prompts[:2]
    at = len(sum(ps, [])) + 1
    eng = make_engine(model_dir)
    _prefill(eng, ps)
    k = eng.cfg.n_positions * 4
    f1 = _decode(ps, at, 0)
    f2 = [dataclasses.replace(_decode(ps, at, 1)[0], decode_steps=k, slot_ids=tuple(range(1000, 1000 + k)))]
    held = Held(monkeypatch)
    t1, out1 = _started(lambda: eng.forward(f1, "epoch-1", seq=1))
    assert held.inside.wait(WAIT_S)
    eng.graphs = types.SimpleNamespace(max_batch=8, bucket=lambda n: 1 << (n - 1).bit_length())  # as on CUDA
    t2, out2 = _started(lambda: eng.forward(f2, "epoch-1", seq=2, after_seq=1))
    t2.join(1.0)
    held.release.set()
    for t in (t1, t2):
        t.join(WAIT_S)
    err = out2.get("error")
    assert isinstance(err, WorkerError) and err.code == "INVALID_ARGUMENT", repr(err)
    assert built == [], f"a StepFeed of {built} steps was built for a batch validation rejects (n_positions {eng.cfg.n_positions})"
