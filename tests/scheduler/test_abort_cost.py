"""Aborts cost O(1) each in the scheduler loop: ``RequestTable.abort`` frees the requests the intake flagged
without scanning the waiting queue or the running list for flags, and removes many aborted requests in one
pass. A unit test of the loop's abort step on the request table (cache and worker are stand-ins that record
what they are asked)."""

from __future__ import annotations

from collections import deque

import structlog

from codeserve.v1 import common_pb2
from scheduler_svc.intake import Intake
from scheduler_svc.request import Finish, Params, Req, State
from scheduler_svc.requests import RequestTable


class CountingDeque(deque):
    """A deque that counts full iterations and ``remove`` calls (each a scan)."""

    iterations = 0
    removes = 0

    def __iter__(self):
        CountingDeque.iterations += 1
        return super().__iter__()

    def remove(self, value) -> None:
        CountingDeque.removes += 1
        super().remove(value)


class Recorder:
    """Stands in for the cache and worker clients: records release calls."""

    def __init__(self) -> None:
        self.released: list[list[str]] = []

    def defer_release(self, rids) -> None:
        if rids:
            self.release_requests(rids)

    def defer_cache(self, items) -> None:
        pass

    deferred_ends = 0  # its defer_* send at once

    def flush_deferred(self) -> None:
        pass

    def release_requests(self, rids) -> None:
        self.released.append(list(rids))

    def release(self, rids) -> None:
        self.released.append(list(rids))


class Stream:
    def __init__(self) -> None:
        self.finish: Finish | None = None
        self.closed = False

    def finish_without_token(self, finish: Finish) -> None:
        self.finish = finish

    def close(self) -> None:
        self.closed = True


class Loop:
    """What the loop does with aborts, on the real table and intake: ``abort`` is the thread-safe flag
    (``Scheduler.abort``), ``apply_aborts`` the loop's step (``RequestTable.abort``), ``intake`` its take."""

    def __init__(self, cache, worker) -> None:
        self.intake = Intake(10_000)
        self.table = RequestTable(cache, worker, self.intake, structlog.get_logger())

    def abort(self, rid: str) -> bool:
        return self.intake.abort(rid, "test")

    def apply_aborts(self, held=()) -> None:
        self.table.abort(held=held)

    def take(self) -> None:
        self.table.take_new()

    @property
    def waiting(self):
        return self.table.waiting

    @property
    def running(self):
        return self.table.running


def scheduler_with(waiting: int, running: int) -> tuple[Loop, list[Req], list[Req], Recorder]:
    cache, worker = Recorder(), Recorder()
    sched = Loop(cache, worker)
    params = Params(max_new_tokens=4, asked_max_new_tokens=4, sampling=common_pb2.SamplingParams())
    reqs = []
    for i in range(waiting + running):
        req = Req(rid=f"r{i}", prompt_ids=[1, 2, 3], params=params)
        req.stream = Stream()
        sched.intake.submit(req, 0)
        reqs.append(req)
    sched.take()
    sched.table.waiting = CountingDeque(sched.table.waiting)
    for req in reqs[waiting:]:  # admitted: moved to running
        sched.waiting.remove(req)
        req.phase, req.worker_knows = State.DECODE, True
        sched.running.append(req)
    CountingDeque.iterations = CountingDeque.removes = 0
    return sched, reqs[:waiting], reqs[waiting:], worker


def test_a_round_without_aborts_does_not_scan_the_queues() -> None:
    sched, waiting, running, _ = scheduler_with(1000, 50)
    sched.apply_aborts()
    assert CountingDeque.iterations == 0 and CountingDeque.removes == 0
    assert len(sched.waiting) == 1000 and len(sched.running) == 50


def test_many_aborts_are_freed_in_one_pass_each_once() -> None:
    sched, waiting, running, worker = scheduler_with(1000, 50)
    doomed_w, doomed_r = waiting[::100], running[::10]
    for req in doomed_w + doomed_r:
        assert sched.abort(req.rid)
        assert sched.abort(req.rid)  # a second abort (client gone and Abort RPC) is not a second entry
    sched.apply_aborts()
    assert CountingDeque.removes == 0 and CountingDeque.iterations <= 1
    assert list(sched.waiting) == [r for r in waiting if r not in doomed_w]
    assert sched.running == [r for r in running if r not in doomed_r]
    assert all(r.stream.finish == Finish.ABORT and r.stream.closed for r in doomed_w + doomed_r)
    assert worker.released == [] and sched.table.releases.pending == [r.rid for r in doomed_r]  # on the next Forward
    assert not any(sched.intake._live.get(r.rid) for r in doomed_w + doomed_r)
    sched.apply_aborts()  # nothing left: nothing freed twice
    assert sched.table.releases.pending == [r.rid for r in doomed_r]


def test_running_aborts_wait_while_a_forward_in_flight_holds_them() -> None:
    """A running request whose abort comes while a Forward in flight holds it stays until no Forward in flight
    does; one that no Forward in flight holds ends in the same round (other Forwards in flight or not)."""
    sched, waiting, running, worker = scheduler_with(10, 5)
    sched.abort(running[0].rid)
    sched.abort(running[1].rid)
    sched.abort(waiting[0].rid)
    sched.apply_aborts(held={running[0].rid, running[2].rid})
    assert waiting[0] not in sched.waiting and running[0] in sched.running and running[1] not in sched.running
    assert sched.table.releases.pending == [running[1].rid]
    sched.apply_aborts(held={running[2].rid})
    assert running[0] not in sched.running and sched.table.releases.pending == [running[1].rid, running[0].rid]
    assert running[2] in sched.running


def test_an_abort_of_a_request_still_in_the_inbox_waits_until_it_is_queued() -> None:
    """Submitted after the loop's intake and aborted at once: freed only once it is in the waiting queue
    (freed from the inbox, it would be queued and run afterwards; seen in the keystroke test)."""
    sched, waiting, _, _ = scheduler_with(3, 0)
    params = Params(max_new_tokens=4, asked_max_new_tokens=4, sampling=common_pb2.SamplingParams())
    late = Req(rid="late", prompt_ids=[1, 2, 3], params=params)
    late.stream = Stream()
    sched.intake.submit(late, len(sched.waiting))
    assert sched.abort("late")
    sched.apply_aborts()
    assert late.stream.finish is None and sched.intake.busy()
    sched.take()
    sched.apply_aborts()
    assert late.stream.finish == Finish.ABORT and late not in sched.waiting
    assert list(sched.waiting) == waiting
