"""The Forward timeline (``worker_svc/forward_log.py``) on a real Worker service, and its report
(``bench/forward_timeline.py``): one line per Forward with its kind, sizes and spans in order, rejected Forwards
marked, and the report's busy time, kinds and gaps computed from them."""

from __future__ import annotations

import time

import grpc
import pytest

from bench import forward_timeline
from codeserve.v1 import worker_pb2, worker_pb2_grpc
from common import grpc_server
from tests.worker.helpers import make_engine
from worker_svc.forward_log import FIELDS, DeviceOrigin, ForwardLog
from worker_svc.service import SERVICE_NAME, add_to_server


@pytest.fixture()
def logged(model_dir, tmp_path):
    engine = make_engine(model_dir, kv_tokens=200, epoch="boot-1")
    engine.origin = DeviceOrigin(engine.device)
    log = ForwardLog(str(tmp_path / "forwards.tsv"))
    running = grpc_server.start(lambda s: add_to_server(engine, s, forward_log=log), [SERVICE_NAME], "127.0.0.1:0")
    ch = grpc_server.channel(f"127.0.0.1:{running.port}")
    yield worker_pb2_grpc.WorkerStub(ch), log
    ch.close()
    running.server.stop(0)
    log.close()


def test_each_forward_is_one_line_with_its_kind_sizes_and_device_span(logged):
    stub, log = logged
    t0 = time.monotonic_ns()
    ext = worker_pb2.ForwardItem(request_id="a", input_ids=[5, 6, 7], position_start=0, slot_ids=[10, 11, 12],
                                 has_prefix=True, sample=True)
    (res,) = stub.Forward(worker_pb2.ForwardRequest(expected_epoch="boot-1", items=[ext], seq=1)).results
    dec = worker_pb2.ForwardItem(request_id="a", input_ids=[res.next_token_id], position_start=3,
                                 slot_ids=[13, 14, 15, 16], decode_steps=4, sample=True)
    stub.Forward(worker_pb2.ForwardRequest(expected_epoch="boot-1", items=[dec], seq=2, after_seq=1))
    bad = worker_pb2.ForwardItem(request_id="nobody", input_ids=[1], position_start=9, slot_ids=[20], sample=True)
    with pytest.raises(grpc.RpcError):
        stub.Forward(worker_pb2.ForwardRequest(expected_epoch="boot-1", items=[bad], seq=3, after_seq=2))
    t1 = time.monotonic_ns()
    with open(log.path, encoding="utf-8") as f:
        lines = [line.rstrip("\n").split("\t") for line in f]
    assert tuple(lines[0]) == FIELDS
    rows = [dict(zip(FIELDS, line)) for line in lines[1:]]
    assert [(r["seq"], r["after_seq"], r["kind"], r["rows"], r["tokens"], r["steps"]) for r in rows] == [
        ("1", "0", "extend", "1", "3", "1"), ("2", "1", "decode", "1", "4", "4"), ("3", "2", "rejected", "1", "1", "1")]
    for r in rows[:2]:
        t_in, t_out, s, e = (int(r[k]) for k in ("in_ns", "out_ns", "dev_start_ns", "dev_end_ns"))
        assert t0 <= t_in <= s <= e <= t_out <= t1
    assert int(rows[1]["dev_start_ns"]) >= int(rows[0]["dev_end_ns"])
    assert (rows[2]["dev_start_ns"], rows[2]["dev_end_ns"]) == ("-1", "-1")
    # the extend was prepared at arrival (extend_ahead), before its device span; the decode (it arrived after the
    # extend had answered) and the rejected Forward were not; none was launched behind
    assert int(rows[0]["in_ns"]) <= int(rows[0]["prepared_ns"]) <= int(rows[0]["dev_start_ns"])
    assert [r["prepared_ns"] for r in rows[1:]] == ["-1", "-1"] and [r["launch"] for r in rows] == ["turn"] * 3
    # each stage's mark, in order, within [in, out]: the multi-step decode waits for its steps and commits
    marks = [forward_timeline.parse_marks(r["marks"]) for r in rows]
    assert [name for name, _ in marks[1]] == ["items", "locked", "turn", "launched", "woke", "committed"]
    assert [name for name, _ in marks[0]] == ["items", "turn", "launched", "woke", "committed"]
    assert marks[2] == ()  # rejected: no marks
    for r, m in zip(rows[:2], marks):
        us = [u for _, u in m]
        assert us == sorted(us) and 0 <= us[0] and us[-1] <= (int(r["out_ns"]) - int(r["in_ns"])) // 1000

    (seg,) = forward_timeline.segments(forward_timeline.read(log.path), split_ns=10**9)
    s = forward_timeline.summarize(seg)
    assert s["forwards"] == 2 and s["kinds"]["extend"]["tokens"] == 3 and s["kinds"]["decode"]["tokens"] == 4
    spans = [(int(r["dev_start_ns"]), int(r["dev_end_ns"])) for r in rows[:2]]
    assert s["wall_ms"] == pytest.approx((spans[1][1] - spans[0][0]) / 1e6)
    assert s["busy_ms"] == pytest.approx(sum(e - b for b, e in spans) / 1e6)
    (gap,) = s["gaps"].values()
    assert gap["n"] == 1 and gap["ms"] == pytest.approx((spans[1][0] - spans[0][1]) / 1e6)
    assert gap["late_ms"] + gap["worker_ms"] == pytest.approx(gap["ms"])
    st = s["stages_p50_ms"]["decode turn"]
    assert list(st) == ["items", "locked", "turn", "launched", "woke", "committed", "out"]
    assert st["launched"] == pytest.approx((marks[1][3][1] - marks[1][2][1]) / 1e3)


def _fwd(seq, kind, in_ms, start_ms, end_ms):
    ms = 10**6
    return forward_timeline.Fwd(seq, kind, 1, 1, 1, in_ms * ms, start_ms * ms, end_ms * ms)


def test_the_report_splits_phases_and_divides_each_gap_into_late_and_worker_time():
    fwds = [_fwd(1, "extend", 0, 1, 10), _fwd(2, "decode", 12, 14, 20), _fwd(3, "decode", 15, 21, 30),
            _fwd(4, "decode", 5000, 5001, 5002)]
    a, b = forward_timeline.segments(fwds, split_ns=10**9)
    assert [f.seq for f in a] == [1, 2, 3] and [f.seq for f in b] == [4]
    s = forward_timeline.summarize(a)
    assert s["wall_ms"] == 29 and s["busy_ms"] == 9 + 6 + 9 and s["busy_share"] == pytest.approx(24 / 29)
    # extend -> decode: the decode reached the worker 2 ms after the extend ended, ran 2 ms after that
    assert s["gaps"]["extend->decode"] == {"n": 1, "ms": 4.0, "late_ms": 2.0, "worker_ms": 2.0, "p50_ms": 4.0,
                                           "prepared_late": 0}
    # decode -> decode: it was there before the device finished: all of the 1 ms is the worker's
    assert s["gaps"]["decode->decode"] == {"n": 1, "ms": 1.0, "late_ms": 0.0, "worker_ms": 1.0, "p50_ms": 1.0,
                                           "prepared_late": 0}


def test_a_phases_head_and_tail_are_the_time_before_its_first_forward_and_after_its_last():
    fwds = [_fwd(1, "extend", 0, 40, 50), _fwd(2, "decode", 51, 52, 90)]
    # requests (sent, done) in time.monotonic seconds: the first sent at 10 ms, the last answered at 97 ms
    reqs = [(0.030, 0.095), (0.010, 0.097), (0.020, 0.060)]
    got = forward_timeline.head_tail(fwds, reqs)
    assert got["head_ms"] == pytest.approx(30.0) and got["tail_ms"] == pytest.approx(7.0)
    assert forward_timeline.head_tail(fwds, []) == {} and forward_timeline.head_tail([], reqs) == {}


def test_the_report_counts_forwards_launched_behind_and_gaps_whose_next_forward_was_prepared_too_late():
    ms = 10**6
    fwds = [forward_timeline.Fwd(1, "decode", 8, 8, 8, 0, 0, 10 * ms),
            forward_timeline.Fwd(2, "decode", 8, 8, 8, 2 * ms, 10 * ms, 20 * ms, 5 * ms, True),  # prepared, behind
            forward_timeline.Fwd(3, "decode", 8, 8, 8, 15 * ms, 24 * ms, 30 * ms, 22 * ms),  # prepared after 20
            forward_timeline.Fwd(4, "decode", 8, 8, 8, 25 * ms, 31 * ms, 40 * ms, 29 * ms)]  # prepared before 30
    s = forward_timeline.summarize(fwds)
    assert s["kinds"]["decode"]["behind"] == 1
    g = s["gaps"]["decode->decode"]
    assert g["n"] == 2 and g["prepared_late"] == 1 and g["ms"] == pytest.approx(5.0)


def test_the_listing_gives_each_forward_of_a_kind_its_idle_and_arrival_against_the_one_ahead():
    ms = 10**6
    fwds = [forward_timeline.Fwd(1, "extend", 8, 8192, 1, 0, 0, 10 * ms),
            forward_timeline.Fwd(2, "decode", 256, 256, 8, 7 * ms, 10 * ms, 36 * ms, 8 * ms, True,
                                 (("items", 1000), ("near_end", 2500))),  # arrived 3 ms before the extend ended
            forward_timeline.Fwd(3, "decode", 256, 256, 8, 40 * ms, 44 * ms, 70 * ms),  # arrived 4 ms after it
            forward_timeline.Fwd(4, "decode", 8, 8, 8, 70 * ms, 71 * ms, 80 * ms)]
    lines = forward_timeline.listing(fwds, "decode", min_rows=64)
    assert len(lines) == 2
    assert "rows  256 behind ahead extend idle    0.0 arrived    -3.0  items 1.0 near_end 2.5" in lines[0]
    assert "turn   ahead decode idle    8.0 arrived     4.0" in lines[1]
    assert len(forward_timeline.listing(fwds, "decode")) == 3 and forward_timeline.listing(fwds, "extend") == []
    with pytest.raises(SystemExit):
        forward_timeline.main(["/dev/null", "--list", "decode:x"])


def test_the_handoffs_split_the_idle_before_a_forward_at_its_turn():
    ms = 10**6
    fwds = [forward_timeline.Fwd(1, "decode", 256, 256, 8, 0, 1 * ms, 30 * ms,
                                 marks=(("turn", 100), ("launched", 4000), ("woke", 30100), ("committed", 33000))),
            # arrived at 27 ms, its turn 4 ms after the commit ahead (at 33 ms), launched 5 ms later, on the device at 38
            forward_timeline.Fwd(2, "decode", 256, 256, 8, 27 * ms, 38 * ms, 60 * ms,
                                 marks=(("items", 2000), ("turn", 10000), ("launched", 15000))),
            forward_timeline.Fwd(3, "decode", 256, 256, 8, 50 * ms, 60 * ms, 90 * ms, 55 * ms, True,
                                 (("near_end", 8000), ("launched", 9000))),  # behind: not counted
            forward_timeline.Fwd(4, "decode", 8, 8, 8, 90 * ms, 91 * ms, 95 * ms, marks=(("turn", 100), ("launched", 200)))]
    h = forward_timeline.turn_handoffs(fwds, "decode", min_rows=64)
    assert h["n"] == 1
    assert h["commit_ahead"]["ms"] == pytest.approx(2.9) and h["handoff"]["ms"] == pytest.approx(4.0)
    assert h["launch"]["ms"] == pytest.approx(5.0) and h["idle"]["p50_ms"] == pytest.approx(8.0)
    assert forward_timeline.turn_handoffs(fwds, "extend")["n"] == 0
