"""The overlapped-decode chain goes on through admissions: an arrival's extend is sent ahead of the decode Forward
queued in flight, applied first, and its request joins the next chained decode at its first decode (a fresh
entry beside the continuing ones' ``input_from_last_sample`` entries), instead of the loop draining the queued
decode Forward and taking the synchronous path."""

from __future__ import annotations

from tests.scheduler.test_chunk_pipeline import TOKEN, ended, loop, settled  # noqa: F401


def test_an_arrival_joins_the_chained_decode_at_its_first_decode(loop):
    import threading

    sched, worker, submit, core = loop
    worker.hold = False
    threading.Thread(target=sched.run, daemon=True).start()
    a = submit("a", list(range(100, 110)), 60)  # decoding while b arrives
    worker.wait_sent(4)  # a's extend and chained decode Forwards
    b = submit("b", list(range(200, 212)), 5)
    assert ended(b) == ([TOKEN] * 5, "length")
    mixed = [r for r in worker.sent
             if {it.request_id for it in r.items} == {"a", "b"} and all(len(it.input_ids) <= 1 for it in r.items)
             and any(it.input_from_last_sample for it in r.items) and not all(it.input_from_last_sample for it in r.items)]
    assert mixed, "b's first decode rode in a chained decode Forward beside a's continuation (was: drain, sync decode)"
    assert ended(a) == ([TOKEN] * 60, "length")
    settled(sched, core)
