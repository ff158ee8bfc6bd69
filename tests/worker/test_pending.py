"""PendingForwards: the Forwards enqueued and not yet committed (worker_svc/pending.py), as a unit."""

from __future__ import annotations

import threading
import time

import pytest

from worker_svc.pending import PendingForwards
from worker_svc.types import WorkerError


class Decode:  # stand-ins for multistep.EnqueuedSteps and extend_behind.EnqueuedExtend: only the kind matters here
    pass


class Extend:
    pass


def test_only_last_and_all_of_answer_by_seq_and_kind():
    lock = threading.Lock()
    p = PendingForwards(lock)
    a, b = Extend(), Extend()
    assert not p and p.only(1) is None and p.last(1, Extend) is None and p.all_of(Extend)
    p.add(1, a)
    assert p.only(1) is a and p.only(2) is None and p.last(1, Extend) is a and p.last(1, Decode) is None
    p.add(2, b)
    assert p.only(1) is None and p.only(2) is None and p.last(2, Extend) is b and p.last(1, Extend) is None
    assert p.all_of(Extend) and not p.all_of(Decode) and p.steps() == [a, b]
    p.add(3, Decode())
    assert not p.all_of(Extend)


def test_leave_finds_the_steps_by_identity_even_when_a_seq_is_reused():
    lock = threading.Lock()
    p = PendingForwards(lock)
    a, b = Decode(), Decode()
    p.add(5, a)
    p.add(5, b)  # a malformed call reused seq 5
    with lock:
        p.leave(b)
    assert p.entries == [(5, a)]


def test_wait_empty_returns_once_the_last_pending_forward_leaves():
    lock = threading.Lock()
    p = PendingForwards(lock)
    steps = Decode()
    p.add(1, steps)
    waited = []

    def waiter():
        with lock:
            p.wait_empty(2)
            waited.append(list(p.entries))

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    assert waited == []  # still blocked: seq 1 is pending
    with lock:
        p.leave(steps)
    t.join(5)
    assert waited == [[]]


def test_wait_empty_raises_aborted_naming_the_forward_ahead_after_the_timeout():
    lock = threading.Lock()
    p = PendingForwards(lock, turn_timeout_s=0.05)
    p.add(7, Decode())
    with lock, pytest.raises(WorkerError) as err:
        p.wait_empty(8)
    assert err.value.code == "ABORTED" and "seq 8" in err.value.message and "seq 7" in err.value.message
    assert len(p.entries) == 1  # nothing left on the timeout
