"""Arrivals admitted while a decode Forward runs wait, once two extends in flight are unanswered, for a reply or a
whole chunk of them (``scheduler_svc/arrival_gate.py``): a burst that trickles in is prefilled in one extend, not
one extend per arrival (H100 run 22 call 5: 15 extends of 4,000 tokens on average at a c64 wave's start).

The loop runs against the real cache service and the chunk pipeline's recording worker, which holds every reply
until the test answers it: "two extends queued" is a state, not a timing."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from scheduler_svc.arrival_gate import ArrivalGate, unanswered_extends
from tests.scheduler.test_chunk_pipeline import CHUNK, TOKEN, WAIT_S, ended, loop, settled  # noqa: F401


def rids(request) -> list[str]:
    return sorted(it.request_id for it in request.items)


def decoding_with_two_arrival_extends(sched, worker, submit):
    """d decodes with its decode Forward in flight (unanswered) and the chained one queued; x1 and x2 arrived and
    each went out in an extend behind it, both unanswered. Returns (d, x1, x2)."""
    threading.Thread(target=sched.run, daemon=True).start()
    d = submit("d", list(range(300, 305)), 40)
    worker.answer(worker.wait_sent(1)[0].seq)  # d's extend: its first token
    worker.wait_sent(3)  # decode N (the loop waits for it, admitting arrivals) and N+1 chained behind it
    x1 = submit("x1", list(range(400, 404)), 2)
    assert rids(worker.wait_sent(4)[-1]) == ["x1"]
    x2 = submit("x2", list(range(410, 414)), 2)
    assert rids(worker.wait_sent(5)[-1]) == ["x2"]
    return d, x1, x2


def taken(sched, rids: list[str]) -> None:
    """Waits until the loop has taken exactly ``rids`` from the intake into its waiting queue (read under the GIL: a
    copy of the queue's ids)."""
    deadline = time.monotonic() + WAIT_S
    while sorted(r.rid for r in list(sched.waiting)) != rids:
        assert time.monotonic() < deadline, f"waiting {sorted(r.rid for r in list(sched.waiting))}, expected {rids}"
        time.sleep(0.005)


def finish(worker, sched, core, reqs) -> None:
    with worker.changed:
        worker.hold = False
        pending = [s for s in worker.replies if s not in worker.answered]
    for seq in pending:
        worker.answer(seq)
    for r in reqs:
        assert ended(r)[0][:1] == [TOKEN]
    settled(sched, core)


def test_arrivals_behind_two_queued_extends_go_in_one_extend_after_a_reply(loop):
    sched, worker, submit, core = loop
    d, x1, x2 = decoding_with_two_arrival_extends(sched, worker, submit)
    late = [submit(f"y{i}", list(range(500 + 10 * i, 504 + 10 * i)), 2) for i in range(3)]  # 12 tokens < CHUNK
    taken(sched, ["y0", "y1", "y2"])  # the loop took them (from the intake) and held them
    assert len(worker.sent) == 5
    worker.answer(worker.sent[3].seq)  # x1's extend answered: one extend queued now
    assert rids(worker.wait_sent(6)[-1]) == ["y0", "y1", "y2"], "the three arrivals went out together"
    finish(worker, sched, core, [d, x1, x2, *late])


def test_arrivals_held_in_one_window_go_out_when_the_reply_came_between_windows(loop):
    """x1's reply lands while the loop applies decode N (between N's admission window and the next one, at
    ``_drain_extends``): the next window tries the held arrivals at its start (``ArrivalGate.admit_first``), with
    chain admissions off too; before, nothing reopened the gate and they waited behind N+1 (review of session 23)."""
    sched, worker, submit, core = loop
    sched.cfg = dataclasses.replace(sched.cfg, chain_admissions=False)
    d, x1, x2 = decoding_with_two_arrival_extends(sched, worker, submit)
    late = [submit(f"y{i}", list(range(500 + 10 * i, 504 + 10 * i)), 2) for i in range(3)]
    taken(sched, ["y0", "y1", "y2"])
    n_seq, x1_seq = worker.sent[1].seq, worker.sent[3].seq
    apply = sched._apply

    def apply_landing_x1(batch, reply, seq, *rest):
        if seq == n_seq:
            worker.answer(x1_seq)  # between the windows: N's has ended, the next has not begun
        return apply(batch, reply, seq, *rest)

    sched._apply = apply_landing_x1
    worker.answer(n_seq)
    sent = worker.wait_sent(6)  # N+1 (sent[2]) stays unanswered: only the next window can send them
    assert rids(sent[5]) == ["y0", "y1", "y2"] and sent[2].seq not in worker.answered
    finish(worker, sched, core, [d, x1, x2, *late])


def test_an_arrival_aborted_while_held_is_not_prefilled(loop):
    sched, worker, submit, core = loop
    d, x1, x2 = decoding_with_two_arrival_extends(sched, worker, submit)
    late = [submit(f"y{i}", list(range(500 + 10 * i, 504 + 10 * i)), 2) for i in range(3)]
    taken(sched, ["y0", "y1", "y2"])
    assert sched.abort("y1")  # an editor's next keystroke
    worker.answer(worker.sent[3].seq)
    assert rids(worker.wait_sent(6)[-1]) == ["y0", "y2"], "y1 was aborted before the gate let them go"
    assert ended(late[1])[1] == "abort"
    finish(worker, sched, core, [d, x1, x2, late[0], late[2]])


def test_a_whole_chunk_of_arrivals_goes_out_without_a_reply(loop):
    sched, worker, submit, core = loop
    d, x1, x2 = decoding_with_two_arrival_extends(sched, worker, submit)
    big = [submit(f"z{i}", list(range(600 + 20 * i, 610 + 20 * i)), 2) for i in range(2)]  # 20 tokens >= CHUNK
    sent = worker.wait_sent(6)
    assert "z0" in rids(sent[-1]) and not ({s.seq for s in sent[3:5]} & worker.answered)
    finish(worker, sched, core, [d, x1, x2, *big])


def test_without_the_gate_each_arrival_goes_out_at_once(loop):
    sched, worker, submit, core = loop
    sched.cfg = dataclasses.replace(sched.cfg, arrival_gate=False)
    d, x1, x2 = decoding_with_two_arrival_extends(sched, worker, submit)
    y = submit("y", list(range(500, 504)), 2)
    assert rids(worker.wait_sent(6)[-1]) == ["y"] and not ({s.seq for s in worker.sent[3:5]} & worker.answered)
    finish(worker, sched, core, [d, x1, x2, y])


class Pending:
    def __init__(self, done: bool = False) -> None:
        self.is_done, self.callbacks = done, []

    def done(self) -> bool:
        return self.is_done

    def add_done_callback(self, fn) -> None:
        self.callbacks.append(fn)


@dataclasses.dataclass
class Sent:
    kind: str
    pending: Pending

    @property
    def batch(self):
        return self


@pytest.mark.parametrize("depth", [0, 2])
def test_the_gate_opens_on_an_arrival_or_a_reply_below_its_depth_or_for_a_whole_chunk(depth):
    inflight: list[Sent] = [Sent("decode", Pending())]
    waiting = [0]
    wake = threading.Event()
    gate = ArrivalGate(lambda: unanswered_extends(inflight), lambda: waiting[0], 16, depth, wake)
    waiting[0] = 4
    assert gate.open(arrived=True, room=True)
    assert not gate.open(arrived=True, room=False)
    assert not gate.open(arrived=False, room=True), "nothing new: not planned again"
    for _ in range(2):
        inflight.append(gate.watch(Sent("extend", Pending())))
    assert gate.open(arrived=True, room=True) == (depth == 0), "two extends queued: held (the gate on)"
    waiting[0] = 16
    assert gate.open(arrived=True, room=True), "a whole chunk waits"
    waiting[0] = 4
    inflight[1].pending.is_done = True
    assert gate.open(arrived=False, room=True) == (depth == 2), "a reply opens it (off: arrivals only)"
    assert not gate.open(arrived=False, room=True)
    assert inflight[2].pending.callbacks == ([wake.set] if depth else []), "the gate off: replies wake nothing"
    fresh = ArrivalGate(lambda: unanswered_extends(inflight), lambda: waiting[0], 16, depth, wake)
    assert fresh.admit_first(False, room=True) == (depth == 2), "a new window tries the held requests (gate on)"
    assert not fresh.admit_first(False, room=False) and fresh.admit_first(True, room=False)
    waiting[0] = 0
    assert not fresh.admit_first(False, room=True)
