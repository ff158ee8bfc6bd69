"""The overlapped-decode chain goes on through admissions: an arrival's extend is sent ahead of the decode Forward
queued in flight, applied first, and its request joins the next chained decode at its first decode (a fresh
entry beside the continuing ones' ``input_from_last_sample`` entries), instead of the loop draining the queued
decode Forward and taking the synchronous path."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from tests.scheduler.test_chunk_pipeline import TOKEN, ended, loop, settled  # noqa: F401


@pytest.mark.parametrize("chain_admissions", [True, False])
def test_an_arrival_joins_the_chained_decode_at_its_first_decode(loop, chain_admissions):
    sched, worker, submit, core = loop
    sched.cfg = dataclasses.replace(sched.cfg, chain_admissions=chain_admissions)
    worker.hold = False
    threading.Thread(target=sched.run, daemon=True).start()
    a = submit("a", list(range(100, 110)), 60)  # decoding while b arrives
    worker.wait_sent(4)  # a's extend and chained decode Forwards
    b = submit("b", list(range(200, 212)), 5)
    assert ended(b) == ([TOKEN] * 5, "length")
    mixed = [r for r in worker.sent
             if {it.request_id for it in r.items} == {"a", "b"} and all(len(it.input_ids) <= 1 for it in r.items)
             and any(it.input_from_last_sample for it in r.items) and not all(it.input_from_last_sample for it in r.items)]
    # on: b's first decode rides in a chained decode Forward beside a's continuation (before: drain, sync decode);
    # off (--no-chain-admissions): the old way, no decode Forward mixes the two
    assert bool(mixed) == chain_admissions, [list(r.items) for r in mixed][:1]
    assert ended(a) == ([TOKEN] * 60, "length")
    settled(sched, core)
