"""Frozen worker (R1 at the worker): scheduler_svc.liveness.WorkerLiveness and the scheduler's stall hook.

WorkerLiveness runs against a fake health stub and a fake clock (values of unresponsive_for / stalled at given
times). The hook runs the real loop (``Scheduler.run`` on a thread) against the real cache service (in-process
gRPC server) and a stand-in worker that can be frozen (tests/scheduler/fake_worker.FreezableWorker): its held
Forwards never answer and its health checks end with DEADLINE_EXCEEDED. Stalls are made by moving the fake clock
past the stall timeout and probing once, so no test here waits for a time to pass; the waits below are bounds
for a broken scheduler, not measured times.
"""

from __future__ import annotations

import contextlib
import threading
import time

import grpc
import pytest
import structlog

from cache_svc.core import CacheCore
from codeserve.v1 import scheduler_pb2
from grpc_health.v1 import health_pb2
from scheduler_svc.errors import WorkerStalled
from scheduler_svc.liveness import WorkerLiveness
from scheduler_svc.output import OutputStream
from scheduler_svc.request import StreamEnd
from scheduler_svc.scheduler import Scheduler, SchedulerConfig
from scheduler_svc.validate import build_request
from tests.scheduler.cache_service import cache_service
from tests.scheduler.fake_worker import FakeHealth, FreezableWorker

TOKEN = 77
WAIT_S = 30.0  # bound for a condition that a correct scheduler reaches at once (not a measured time)
STALL = "worker w0 has not answered health checks for 11.0 s (stall timeout 10 s; last probe: DEADLINE_EXCEEDED"


class Clock:
    """A monotonic clock the test moves by hand (seconds)."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---- WorkerLiveness ------------------------------------------------------------------------------------

def test_an_answering_worker_is_live_and_the_silence_counts_from_its_last_answer():
    health, clock = FakeHealth(), Clock(100.0)
    lv = WorkerLiveness(health, clock=clock)
    assert (lv.interval_s, lv.timeout_s, lv.stall_timeout_s) == (1.0, 2.0, 10.0)
    assert lv.probe_once() is True
    assert health.calls == [("", 2.0)]  # the whole server's health, with the probe deadline
    clock.now = 107.5
    assert lv.unresponsive_for() == 7.5 and lv.stalled() is False
    assert lv.probe_once() is True
    assert lv.unresponsive_for() == 0.0 and lv.last_error == ""


def test_a_silent_worker_is_stalled_only_past_the_stall_timeout_and_live_again_at_its_next_answer():
    health, clock = FakeHealth(), Clock(100.0)
    lv = WorkerLiveness(health, stall_timeout_s=10.0, clock=clock)
    lv.probe_once()
    health.failure = grpc.StatusCode.DEADLINE_EXCEEDED  # SIGSTOP: nothing answers
    clock.now = 105.0
    assert lv.probe_once() is False
    assert (lv.unresponsive_for(), lv.stalled()) == (5.0, False)
    assert lv.last_error == "DEADLINE_EXCEEDED: Deadline Exceeded"
    clock.now = 110.0
    assert lv.stalled() is False  # exactly the stall timeout is not past it
    clock.now = 110.5
    assert (lv.unresponsive_for(), lv.stalled()) == (10.5, True)
    health.failure = None  # SIGCONT
    clock.now = 111.0
    assert lv.probe_once() is True
    assert (lv.unresponsive_for(), lv.stalled()) == (0.0, False)


def test_a_dead_worker_is_an_outage_not_a_stall_and_not_serving_is_an_answer():
    health, clock = FakeHealth(), Clock(0.0)
    lv = WorkerLiveness(health, stall_timeout_s=3.0, clock=clock)
    health.failure = grpc.StatusCode.UNAVAILABLE  # connection refused: the process is gone
    clock.now = 20.0
    assert lv.probe_once() is False
    assert (lv.unresponsive_for(), lv.stalled()) == (20.0, False)
    assert lv.last_error.startswith("UNAVAILABLE: ")
    health.failure, health.status = None, health_pb2.HealthCheckResponse.NOT_SERVING  # draining, but it runs
    assert lv.probe_once() is True and lv.unresponsive_for() == 0.0


def test_a_refused_probe_is_taken_once_even_after_the_worker_answers_again():
    """The loop's cue to resync an idle scheduler whose worker died (the restarted one has a new epoch)."""
    health, clock = FakeHealth(), Clock(0.0)
    lv = WorkerLiveness(health, clock=clock)
    assert lv.probe_once() is True and lv.take_refusal() is False
    health.failure = grpc.StatusCode.DEADLINE_EXCEEDED  # frozen: a stall, not a refusal
    assert lv.probe_once() is False and lv.take_refusal() is False
    health.failure = grpc.StatusCode.UNAVAILABLE  # dead
    assert lv.probe_once() is False and lv.probe_once() is False
    health.failure = None  # restarted before the loop looked
    assert lv.probe_once() is True
    assert (lv.take_refusal(), lv.take_refusal()) == (True, False)


def test_settings_must_be_positive():
    for kw in ({"interval_s": 0}, {"timeout_s": -1}, {"stall_timeout_s": 0}):
        with pytest.raises(ValueError, match="must be > 0"):
            WorkerLiveness(FakeHealth(), **kw)


def test_the_probe_thread_records_answers():
    health = FakeHealth()
    lv = WorkerLiveness(health, interval_s=0.01).start()
    try:
        deadline = time.monotonic() + WAIT_S
        while len(health.calls) < 3:
            assert time.monotonic() < deadline, "the probe thread did not probe"
            time.sleep(0.01)
    finally:
        lv.stop()
    assert lv.stalled() is False and lv.last_error == ""


# ---- the scheduler's stall hook --------------------------------------------------------------------------

def wait_until(pred, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {WAIT_S} s")
        time.sleep(0.005)


def ending(req) -> tuple[list[int], StreamEnd]:
    """(tokens streamed, the StreamEnd) once the request's stream ended."""
    out = []
    while True:
        item = req.out.get(timeout=WAIT_S)
        if isinstance(item, StreamEnd):
            return out, item
        out.extend(item.token_ids)


@pytest.fixture
def frozen_loop(tokenizer):
    """``start(overlap)`` -> (scheduler running its loop, FreezableWorker, clock, liveness, submit, cache core),
    one running request at a time (a second one waits); stopped at teardown."""
    started, services = [], contextlib.ExitStack()

    def start(overlap: bool = True):
        core, cache = services.enter_context(cache_service())
        worker = FreezableWorker(TOKEN)
        clock = Clock()
        liveness = WorkerLiveness(worker.health, stall_timeout_s=10.0, clock=clock)  # probed by the test only
        sched = Scheduler(cache, worker, SchedulerConfig(max_running_requests=1, overlap=overlap),
                          structlog.get_logger(), liveness=liveness)
        sched.connect()
        loop = threading.Thread(target=sched.run, daemon=True)
        loop.start()
        started.append((sched, worker, loop))

        def submit(rid: str, max_new: int, prompt: list[int] | None = None):
            req = build_request(scheduler_pb2.GenerateRequest(
                request_id=rid, input_ids=scheduler_pb2.TokenIds(ids=prompt or list(range(10, 30))),
                max_new_tokens=max_new, ignore_eos=True), tokenizer, sched.info, sched.capacity)
            req.stream = OutputStream(req, tokenizer, sched.info.eos_token_id)
            sched.submit(req)
            return req

        return sched, worker, clock, liveness, submit, core

    yield start
    for sched, worker, loop in started:
        sched.stop("test over")
        worker.thaw()
        worker.answer_held()
        loop.join(WAIT_S)
    services.close()


def stall(worker: FreezableWorker, clock: Clock, liveness: WorkerLiveness) -> None:
    """The worker stays silent past the stall timeout: 11 s after its last answer, a probe times out."""
    worker.freeze()
    clock.now += 11.0
    assert liveness.probe_once() is False and liveness.stalled()


def assert_pool_clean(sched: Scheduler, core: CacheCore) -> None:
    wait_until(lambda: sched.queue_lengths()[:2] == (0, 0), "idle")
    sched.cache.flush()
    counters = sched.cache.get_pool().counters
    assert counters.available == counters.capacity == 4096, counters
    assert core.check_integrity("default") == []


def test_a_frozen_worker_fails_requests_fast_and_the_resync_waits_for_its_stale_forward(frozen_loop):
    sched, worker, clock, liveness, submit, core = frozen_loop(overlap=True)
    a = submit("a", 100_000)
    assert a.out.get(timeout=WAIT_S).token_ids == [TOKEN]  # decoding
    c = submit("c", 5)  # waits behind a (one running request at a time)
    worker.freeze()
    wait_until(lambda: worker.held, "a Forward sent to the frozen worker")
    stall(worker, clock, liveness)

    # every request in flight, running or waiting fails with UNAVAILABLE naming the worker
    for req in (a, c):
        _, end = ending(req)
        assert end.code == grpc.StatusCode.UNAVAILABLE and end.message.startswith(STALL), end
    with pytest.raises(WorkerStalled, match="worker w0 has not answered health checks for 11.0 s"):
        submit("b", 5)  # refused at once, never queued behind the frozen worker
    # a failed, but its slots are the old session's until the resync: it still counts (idle = pool settled;
    # was (0, 0, 0): "idle" while the pool held a's slots, seen by the fresh-user review)
    assert sched.queue_lengths() == (1, 0, 0)
    assert sched.progress_ok() is False and sched.unhealthy_reason().startswith(STALL)
    sent = sum(e[0] == "send" for e in worker.events)

    # health answers again; the Forward sent before the stall has not: no new Forward, no resync yet. What the resync
    # will wait for is read before the thaw: the loop may start waiting on it before submit("d") returns
    first = worker.held[0][1]
    waited = first.waiters
    stale_seqs = {request.seq for request, _ in worker.held}
    worker.thaw()
    assert liveness.probe_once() and not liveness.stalled() and sched.progress_ok()
    d = submit("d", 7)
    wait_until(lambda: first.waiters > waited, "the resync waiting for the stale Forward")
    assert sum(e[0] == "send" for e in worker.events) == sent and worker.events.count(("info",)) == 1

    worker.answer_held()  # the resumed worker finishes the stale Forward
    tokens, end = ending(d)
    assert end.code is None and tokens == [TOKEN] * 7
    events = list(worker.events)
    resync = events.index(("info",), 1)  # the second Info: the resync's reconnect
    stale_answers = [i for i, e in enumerate(events) if e[0] == "answer" and e[1] in stale_seqs]
    d_sent = next(i for i, e in enumerate(events) if e[0] == "send" and e[2] == ("d",))
    assert stale_answers and max(stale_answers) < resync < d_sent
    assert any(e[0] == "release" and "a" in e[1] for e in events[resync:])  # a's slot table dropped at the worker
    wait_until(lambda: sched.queue_lengths() == (0, 0, 0), "idle after the resync")
    assert_pool_clean(sched, core)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_worker_frozen_in_an_extend_fails_it_and_is_released_after_its_stale_forward(frozen_loop, overlap):
    """overlap=True: the extend is chained (``Scheduler._chain`` with an extend at its head, nothing admitted while it
    runs). Was: that wait was a bare ``result()``, blind to the stall: the request hung until the Forward's 120 s
    deadline (a fresh helper's SIGSTOP of an idle worker, 3 of 3)."""
    sched, worker, clock, liveness, submit, core = frozen_loop(overlap=overlap)
    worker.freeze()
    x = submit("x", 4)
    wait_until(lambda: worker.held, "the extend sent to the frozen worker")
    stall(worker, clock, liveness)
    tokens, end = ending(x)
    assert tokens == [] and end.code == grpc.StatusCode.UNAVAILABLE and end.message.startswith(STALL)
    stale_seq = worker.held[0][0].seq
    worker.thaw()
    assert liveness.probe_once()
    worker.answer_held()  # the stale extend ran: the worker now holds a slot table for x
    y = submit("y", 6, prompt=list(range(40, 60)))
    tokens, end = ending(y)
    assert end.code is None and tokens == [TOKEN] * 6
    events = list(worker.events)
    answered = events.index(("answer", stale_seq))
    released_x = next(i for i, e in enumerate(events) if e[0] == "release" and "x" in e[1])
    assert answered < released_x < next(i for i, e in enumerate(events) if e[0] == "send" and e[2] == ("y",))
    assert_pool_clean(sched, core)


def test_a_worker_frozen_while_idle_refuses_new_requests_and_serves_again_without_a_resync(frozen_loop):
    sched, worker, clock, liveness, submit, core = frozen_loop()
    assert ending(submit("p", 3))[0] == [TOKEN] * 3
    stall(worker, clock, liveness)
    with pytest.raises(WorkerStalled, match="worker w0 has not answered health checks for 11.0 s"):
        submit("q", 3)
    assert sched.unhealthy_reason().startswith(STALL)
    worker.thaw()
    assert liveness.probe_once() and sched.unhealthy_reason() == ""
    tokens, end = ending(submit("r", 5))
    assert end.code is None and tokens == [TOKEN] * 5
    assert worker.events.count(("info",)) == 1  # nothing was in flight: no resync
    assert_pool_clean(sched, core)
