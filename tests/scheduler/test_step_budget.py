"""Adaptive decode steps (``scheduler_svc/step_budget.py``): the rule on given numbers, the window and the step
time on given timestamps, and the loop with a recording worker and a test clock: decode Forwards carry K steps
with no arrivals, fewer while probes arrive every 2 ms, K again once the arrivals have left the window, and K
throughout with ``adaptive_steps`` off; and the costs the loop keeps from the real worker's replies over gRPC.
No test measures time: the clock is the test's (the gRPC test compares the budget with the replies it got)."""

from __future__ import annotations

import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from common import grpc_server
from scheduler_svc.scheduler import Scheduler, SchedulerConfig
from scheduler_svc.step_budget import COST_EWMA, RUN_WEIGHT, StepBudget, budget_steps, steps_run
from tests.scheduler.cache_service import cache_service
from tests.scheduler.fake_worker import forward_response
from tests.scheduler.test_arrival_order import TOKEN, HeldReply, RecordingWorker, kind, submitter, tokens

K = 8
STEP_S = 0.002  # the recording worker's device seconds per decode step (reported, not slept)
FIXED_S = 0.0003  # and its host seconds a decode Forward besides


def rule(arrivals, window_s, since_last_s, batch, step_s=STEP_S, fixed_s=FIXED_S, max_steps=K, run_weight=RUN_WEIGHT):
    return budget_steps(arrivals, window_s, since_last_s, step_s, fixed_s, batch, max_steps, run_weight)


# ---- the rule ------------------------------------------------------------------------------------------------
def test_nothing_or_one_arrival_keeps_k():
    assert rule(0, 0.128, 0.0, 16) == K
    assert rule(1, 0.128, 0.0, 1) == K  # a lone arrival says nothing of a stream


def test_no_measured_step_no_batch_or_one_step_keep_the_configured_steps():
    assert rule(50, 0.128, 0.0, 16, step_s=0.0) == K
    assert rule(50, 0.128, 0.0, 0) == K
    assert rule(50, 0.128, 0.0, 16, max_steps=1) == 1


def test_the_formula_on_given_numbers():
    assert RUN_WEIGHT == 1 / 8
    # 26 arrivals over 0.125 s (G = 5 ms), 16 decoding, F = 0.3 ms, 2 ms steps (the simulated worker at 200/s):
    # T* = sqrt(2 * 1/8 * 16 * 0.0003 * 0.005) = 2.45 ms -> (2.45 - 0.3) / 2 = 1.07 -> 1
    assert rule(26, 0.125, 0.0, 16) == 1
    # 64 decoding: T* = sqrt(0.25 * 64 * 0.0003 * 0.005) = 4.90 ms -> 2.30 -> 2
    assert rule(26, 0.125, 0.0, 64) == 2
    # the H200 editor's costs (0.8 ms steps, F = 5 ms, 8 decoding, G = 9 ms: 28 arrivals in 0.243 s):
    # T* = sqrt(0.25 * 8 * 0.005 * 0.009) = 9.49 ms -> (9.49 - 5) / 0.8 = 5.6 -> 6; the first form of the rule
    # (F taken as a fixed share of s) gave round(sqrt(2 / 32 * 8 * 9 / 0.8)) = 2 there
    assert rule(28, 0.243, 0.0, 8, step_s=0.0008, fixed_s=0.005) == 6
    assert rule(28, 0.243, 0.0, 8, step_s=0.0008, fixed_s=0.005, run_weight=1 / 4) == K  # T* = 13.4 ms
    # a flood: 1,000 arrivals in 128 ms among 2 requests: T* < F -> 1, never 0
    assert rule(1000, 0.128, 0.0, 2) == 1
    # no fixed cost at all: nothing is saved by more steps -> 1
    assert rule(26, 0.125, 0.0, 16, fixed_s=0.0) == 1


def test_more_arrivals_never_give_more_steps_and_more_requests_never_fewer():
    by_arrivals = [rule(n, 0.128, 0.0, 64, fixed_s=0.002) for n in range(0, 400)]
    assert by_arrivals == sorted(by_arrivals, reverse=True) and by_arrivals[0] == K and by_arrivals[-1] == 1
    assert rule(30, 0.128, 0.0, 16) < K  # so that the next two can grow
    by_batch = [rule(30, 0.128, 0.0, b) for b in range(1, 2000, 7)]
    assert by_batch == sorted(by_batch) and by_batch[-1] == K
    # (T* - F) grows with F up to F = RUN_WEIGHT * B * G / 2 (4.4 ms here), then falls: a round that cannot be
    # shorter than F makes arrivals wait F / 2 whatever k is, and past that point one step is the shortest
    fixed = [f / 1e4 for f in range(1, 400)]
    by_fixed = [rule(30, 0.128, 0.0, 16, fixed_s=f) for f in fixed]
    top = RUN_WEIGHT * 16 * (0.128 / 29) / 2
    rising, falling = [k for f, k in zip(fixed, by_fixed) if f <= top], [k for f, k in zip(fixed, by_fixed) if f > top]
    assert rising == sorted(rising) and falling == sorted(falling, reverse=True) and falling[-1] == 1
    for n in range(2, 400):  # the least of lam T / 2 + w B F / T over T = F + k s, k in 1..K
        lam, b, f, w = (n - 1) / 0.128, 64, 0.002, RUN_WEIGHT
        best = min(range(1, K + 1), key=lambda k: lam * (f + k * STEP_S) / 2 + w * b * f / (f + k * STEP_S))
        assert abs(by_arrivals[n] - best) <= 1, n  # rounding k of the continuous optimum: at most one step off


def test_a_silence_longer_than_the_windows_gap_is_the_gap():
    # 65 arrivals in a burst (G = 0.128 / 64 = 2 ms), 64 decoding: T* = sqrt(0.25 * 64 * 0.0003 * 0.002) = 3.10 ms
    # -> 1.4 -> 1
    assert rule(65, 0.128, 0.0, 64) == 1
    assert rule(65, 0.128, 0.002, 64) == 1  # no longer than the gap: the window's
    # 40 ms without an arrival: G = 40 ms, T* = 13.9 ms -> 6.8 -> 7; 80 ms: 19.6 ms -> 9.6 -> K
    assert rule(65, 0.128, 0.040, 64) == 7
    assert rule(65, 0.128, 0.080, 64) == K


def test_negative_inputs_are_refused():
    with pytest.raises(ValueError, match="arrivals"):
        rule(-1, 0.1, 0.0, 4)
    with pytest.raises(ValueError, match="since the last"):
        rule(3, 0.1, -0.001, 4)
    with pytest.raises(ValueError, match="fixed cost"):
        rule(3, 0.1, 0.0, 4, fixed_s=-0.001)


# ---- the measurements --------------------------------------------------------------------------------------
def reply(device_s: float, forward_s: float):
    return forward_response([], TOKEN, forward_seconds=forward_s, device_seconds=device_s)


def test_costs_are_the_first_reply_then_a_weighted_mean():
    b = StepBudget()
    assert b.step_s == 0.0 and b.steps(0.0, 8, K) == K  # nothing measured yet
    b.measured(8, reply(0.016, 0.0175))
    assert b.step_s == pytest.approx(0.002) and b.fixed_s == pytest.approx(0.0015)
    b.measured(1, reply(0.004, 0.004))
    assert b.step_s == pytest.approx(0.002 + COST_EWMA * (0.004 - 0.002))
    assert b.fixed_s == pytest.approx(0.0015 + COST_EWMA * (0.0 - 0.0015))
    b.measured(0, reply(1.0, 2.0))  # nothing ran: ignored
    b.measured(8, reply(0.0, 1.0))  # no device time reported: ignored
    assert b.step_s == pytest.approx(0.0025) and b.fixed_s == pytest.approx(0.001125)


def test_arrivals_leave_the_window_after_k_rounds_and_silence_counts():
    b = StepBudget()
    b.measured(K, reply(K * STEP_S, K * STEP_S + FIXED_S))
    window = K * (FIXED_S + K * STEP_S)  # 0.1304 s
    for i in range(11):  # 11 arrivals 1 ms apart, the last at 10 ms
        b.arrived(i * 0.001, 1)
    r = lambda n, since: rule(n, window, since, 32)  # noqa: E731
    assert b.steps(0.010, 32, K) == r(11, 0.0) == 3  # G = 13 ms: T* = 5.6 ms -> 2.6
    assert b.steps(0.013, 32, K) == r(11, 0.003) == 3  # 3 ms < G
    assert b.steps(0.040, 32, K) == r(11, 0.030) == 4  # G = 30 ms: T* = 8.5 ms -> 4.1
    assert b.steps(window + 0.0005, 32, K) == r(10, window - 0.0095)  # one left
    assert b.steps(0.010 + window, 32, K) == K  # all left: K again
    b.arrived(1.0, 3)  # three taken at once count as three
    b.arrived(1.001, 0)  # nothing taken: nothing counted
    assert b.steps(1.001, 32, K) == r(3, 0.001) == 6  # G = 65 ms: T* = 12.5 ms -> 6.1


# ---- the loop ------------------------------------------------------------------------------------------------
class Clock:
    """The budget's clock in the loop test: seconds that only the test advances."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class TimedWorker(RecordingWorker):
    """A RecordingWorker whose replies report STEP_S device seconds a decode step and FIXED_S host seconds besides
    (``device_seconds``, ``forward_seconds``) and that records
    (clock time, steps) of each decode Forward it is sent."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self.decodes: list[tuple[float, int]] = []

    def send(self, request):
        items = list(request.items)
        self._record(request.seq, request.after_seq, items)
        self.released.extend(request.release_request_ids)
        steps = max([it.decode_steps for it in items] + [1])
        if kind(items) == "decode":
            self.decodes.append((self.clock.t, steps))
        return HeldReply(forward_response(items, TOKEN, forward_seconds=FIXED_S + STEP_S * steps,
                                          device_seconds=STEP_S * steps), hold=False)


@pytest.fixture(params=[True, False], ids=["adaptive", "fixed"])
def timed_loop(tokenizer, request):
    with cache_service() as (_, cache):
        clock = Clock()
        worker = TimedWorker(clock)
        sched = Scheduler(cache, worker, SchedulerConfig(decode_steps=K, overlap=True, adaptive_steps=request.param),
                          structlog.get_logger())
        sched.budget.clock = clock
        sched.connect()
        yield sched, worker, clock, submitter(sched, tokenizer), request.param


def test_chained_decode_forwards_carry_fewer_steps_while_probes_arrive_and_k_without(timed_loop):
    sched, worker, clock, submit, adaptive = timed_loop
    background = [submit(f"bg{i}", list(range(10 + i, 30 + i)), 900) for i in range(4)]
    for _ in range(4):  # their extend and first decodes
        sched.step()
    clock.t += 1.0  # their arrivals have left the window: steady decode
    quiet_from = len(worker.decodes)
    for _ in range(6):
        sched.step()
    quiet = [k for _, k in worker.decodes[quiet_from:]]
    assert len(quiet) >= 5 and quiet == [K] * len(quiet), "with no arrivals every decode Forward carries K steps"

    probes, busy_from = [], len(worker.decodes)
    for i in range(20):  # two probes every 2 ms of the test's clock, one prefill token each
        clock.t += 0.002
        probes += [submit(f"p{i}{j}", list(range(100 + i + j, 112 + i + j)), 1) for j in range(2)]
        for _ in range(3):
            sched.step()
    busy = [k for _, k in worker.decodes[busy_from:]]
    # 20 or more arrivals in the window (G <= 8 ms), 4 decoding, F = 0.3 ms: T* <= 1.1 ms < F + s: 1 step
    late = busy[len(busy) // 2:]
    assert len(late) >= 10
    if adaptive:
        assert max(late) == 1 and sched.stats["decode_steps_cut"] >= len(late), busy
        samples = {(m.name, m.labels.get("le")): m.value for f in text_string_to_metric_families(sched.metrics_text())
                   for m in f.samples}
        assert samples[("codeserve:decode_forward_steps_bucket", "2.0")] >= len(late)
        assert samples[("codeserve:decode_forward_steps_count", None)] == len(worker.decodes)
        assert samples[("codeserve:decode_forwards_steps_cut_total", None)] == sched.stats["decode_steps_cut"]
    else:
        assert late == [K] * len(late) and sched.stats["decode_steps_cut"] == 0

    clock.t += 1.0  # the arrivals have left the window: K again
    after_from = len(worker.decodes)
    for _ in range(4):
        sched.step()
    after = [k for _, k in worker.decodes[after_from:]]
    assert after and after[-2:] == [K, K], after
    for p in probes:
        assert tokens(p) == [TOKEN]
    for r in background:
        sched.abort(r.rid)
    for _ in range(10):
        if not sched.step() and not sched.running:
            break
    assert not sched.running
    assert sched.budget.step_s == pytest.approx(STEP_S) and sched.budget.fixed_s == pytest.approx(FIXED_S)


# ---- over real gRPC ------------------------------------------------------------------------------------------
def test_the_costs_the_loop_keeps_are_the_real_workers_replies_over_grpc(model_path, tokenizer):
    """The real worker service (the default model on the CPU) on a real port: the budget's s and F are the weighted
    means of its decode replies' device_seconds / steps and forward_seconds - device_seconds, one step and K."""
    from codeserve.v1 import worker_pb2_grpc
    from scheduler_svc.worker_client import WorkerClient
    from tests.worker.helpers import make_engine
    from worker_svc.service import SERVICE_NAME as WORKER_SERVICE, WorkerServicer

    class Recording(WorkerServicer):
        def __init__(self, engine) -> None:
            super().__init__(engine)
            self.decodes: list[tuple[int, float, float]] = []  # (steps, device_seconds, forward_seconds)

        def Forward(self, request, context):
            reply = super().Forward(request, context)
            if kind(list(request.items)) == "decode":
                self.decodes.append((max([it.decode_steps for it in request.items] + [1]), reply.device_seconds,
                                     reply.forward_seconds))
            return reply

    servicer = Recording(make_engine(model_path, kv_tokens=4096, epoch="boot-1"))
    worker_server = grpc_server.start(lambda s: worker_pb2_grpc.add_WorkerServicer_to_server(servicer, s),
                                      [WORKER_SERVICE], "127.0.0.1:0")
    worker = WorkerClient(f"127.0.0.1:{worker_server.port}")
    try:
        with cache_service() as (_, cache):
            for steps in (1, 4):
                sched = Scheduler(cache, worker, SchedulerConfig(decode_steps=steps, overlap=False), structlog.get_logger())
                sched.connect()
                servicer.decodes.clear()
                req = submitter(sched, tokenizer)(f"r{steps}", [7, 8, 9, 10], 13)
                for _ in range(40):
                    if not sched.step() and not sched.running:
                        break
                assert len(tokens(req)) == 13 and len(servicer.decodes) >= 3
                assert {k for k, _, _ in servicer.decodes} == {steps}
                step_s = fixed_s = 0.0
                for k, device_s, forward_s in servicer.decodes:
                    assert 0 < device_s <= forward_s
                    per_step, fixed = device_s / k, forward_s - device_s
                    step_s, fixed_s = ((per_step, fixed) if step_s == 0 else
                                       (step_s + COST_EWMA * (per_step - step_s), fixed_s + COST_EWMA * (fixed - fixed_s)))
                assert sched.budget.step_s == pytest.approx(step_s) and sched.budget.fixed_s == pytest.approx(fixed_s)
    finally:
        worker.close()
        worker_server.server.stop(0)


def test_the_steps_run_leave_out_skipped_items():
    # a request stopped in the Forward before is skipped at the worker: its k steps did not run, the others' did
    entry = lambda k: type("E", (), {"steps": k})()  # noqa: E731
    res = lambda skipped: type("R", (), {"skipped": skipped})()  # noqa: E731
    assert steps_run([entry(8), entry(3)], [res(True), res(False)]) == 3
    assert steps_run([entry(8), entry(3)], [res(False), res(False)]) == 8
    assert steps_run([entry(8)], [res(True)]) == 0
    b = StepBudget()
    b.measured(steps_run([entry(8), entry(3)], [res(True), res(False)]), reply(3 * STEP_S, 3 * STEP_S + FIXED_S))
    assert b.step_s == pytest.approx(STEP_S)  # 3 steps ran, not 8
    with pytest.raises(ValueError):
        steps_run([entry(8), entry(3)], [res(False)])  # a reply that does not answer every item
