"""Adaptive decode steps (``scheduler_svc/step_budget.py``): the rule on given numbers, the window and the step
time on given timestamps, and the loop with a recording worker and a test clock: decode Forwards carry K steps
with no arrivals, fewer while probes arrive every 2 ms, K again once the arrivals have left the window, and K
throughout with ``adaptive_steps`` off. No test measures time: the clock is the test's."""

from __future__ import annotations

import math

import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from cache_svc.core import CacheCore
from cache_svc.service import SERVICE_NAME as CACHE_SERVICE, CacheServicer
from codeserve.v1 import cache_pb2_grpc
from common import grpc_server
from scheduler_svc.cache_client import CacheClient
from scheduler_svc.scheduler import Scheduler, SchedulerConfig
from scheduler_svc.step_budget import STEP_EWMA, WAIT_SHARE, StepBudget, budget_steps
from tests.scheduler.fake_worker import forward_response
from tests.scheduler.test_arrival_order import TOKEN, HeldReply, RecordingWorker, kind, submitter, tokens

K = 8
STEP_S = 0.002  # the recording worker's seconds per decode step (reported, not slept)


# ---- the rule ------------------------------------------------------------------------------------------------
def test_nothing_or_one_arrival_keeps_k():
    assert budget_steps(0, 0.128, 0.0, STEP_S, 16, K) == K
    assert budget_steps(1, 0.128, 0.0, STEP_S, 1, K) == K  # a lone arrival says nothing of a stream


def test_no_measured_step_no_batch_or_one_step_keep_the_configured_steps():
    assert budget_steps(50, 0.128, 0.0, 0.0, 16, K) == K
    assert budget_steps(50, 0.128, 0.0, STEP_S, 0, K) == K
    assert budget_steps(50, 0.128, 0.0, STEP_S, 16, 1) == 1


def test_the_formula_on_given_numbers():
    # 21 arrivals over 64 steps of 1.75 ms: G = 0.112 / 20 = 5.6 ms; 20 decoding:
    # sqrt(2 * 1/32 * 20 * 5.6 / 1.75) = sqrt(4) = 2 (the default share); sqrt(8) = 2.83 -> 3 with 1/16
    assert WAIT_SHARE == 1 / 32
    assert budget_steps(21, 0.112, 0.0, 0.00175, 20, K) == 2
    assert budget_steps(21, 0.112, 0.0, 0.00175, 20, K, wait_share=1 / 16) == 3
    # with 1/16: 11 arrivals in 128 ms (G = 12.8 ms), 8 decoding, 2 ms steps: sqrt(0.125 * 8 * 6.4) = 2.53 -> 3
    assert budget_steps(11, 0.128, 0.0, STEP_S, 8, K, wait_share=1 / 16) == 3
    # 2 arrivals in 128 ms, 8 decoding: sqrt(0.125 * 8 * 64) = 8 -> K; 64 decoding: 22.6 -> clamped to K
    assert budget_steps(2, 0.128, 0.0, STEP_S, 8, K, wait_share=1 / 16) == K
    assert budget_steps(2, 0.128, 0.0, STEP_S, 64, K) == K
    # a flood: 1,000 arrivals in 128 ms among 2 requests: sqrt(0.125 * 2 * 0.0641) < 1 -> 1, never 0
    assert budget_steps(1000, 0.128, 0.0, STEP_S, 2, K) == 1


def test_more_arrivals_never_give_more_steps_and_more_requests_never_fewer():
    by_arrivals = [budget_steps(n, 0.128, 0.0, STEP_S, 16, K) for n in range(0, 200)]
    assert by_arrivals == sorted(by_arrivals, reverse=True) and by_arrivals[0] == K and by_arrivals[-1] == 1
    by_batch = [budget_steps(30, 0.128, 0.0, STEP_S, b, K) for b in range(1, 100)]
    assert by_batch == sorted(by_batch)
    for n in range(2, 200):  # the bound: the arrivals' wait behind one Forward, lam (k s)^2 / 2 <= WAIT_SHARE * B * s
        bound = math.sqrt(2 * WAIT_SHARE * 16 * STEP_S / ((n - 1) / 0.128)) / STEP_S  # in steps
        assert by_arrivals[n] == max(1, min(K, math.floor(bound + 0.5)))


def test_a_silence_longer_than_the_windows_gap_is_the_gap():
    # (the share of the first design, 1/16: 2 * 1/16 = 0.125) 65 arrivals in a burst (G = 0.128 / 64 = 2 ms): 64 decoding get round(sqrt(0.125 * 64 * 1)) = 3 steps
    assert budget_steps(65, 0.128, 0.0, STEP_S, 64, K, wait_share=1 / 16) == 3
    assert budget_steps(65, 0.128, 0.002, STEP_S, 64, K, wait_share=1 / 16) == 3  # no longer than the gap: the window's
    # 16 ms without an arrival: G = 16 ms, sqrt(0.125 * 64 * 8) = 8 -> K
    assert budget_steps(65, 0.128, 0.016, STEP_S, 64, K, wait_share=1 / 16) == K
    # 16 decoding need longer: 8 ms -> sqrt(0.125 * 16 * 4) = 2.83 -> 3, 64 ms -> 8
    assert budget_steps(65, 0.128, 0.008, STEP_S, 16, K, wait_share=1 / 16) == 3
    assert budget_steps(65, 0.128, 0.064, STEP_S, 16, K, wait_share=1 / 16) == K


def test_negative_inputs_are_refused():
    with pytest.raises(ValueError, match="arrivals"):
        budget_steps(-1, 0.1, 0.0, STEP_S, 4, K)
    with pytest.raises(ValueError, match="since the last"):
        budget_steps(3, 0.1, -0.001, STEP_S, 4, K)


# ---- the measurements --------------------------------------------------------------------------------------
def test_step_time_is_the_first_reply_then_a_weighted_mean():
    b = StepBudget()
    assert b.step_s == 0.0 and b.steps(0.0, 8, K) == K  # nothing measured yet
    b.measured(8, 0.016)
    assert b.step_s == pytest.approx(0.002)
    b.measured(1, 0.004)
    assert b.step_s == pytest.approx(0.002 + STEP_EWMA * (0.004 - 0.002))
    b.measured(0, 1.0)  # nothing ran: ignored
    assert b.step_s == pytest.approx(0.0025)


def test_arrivals_leave_the_window_after_k_squared_steps_and_silence_counts():
    b = StepBudget()
    b.wait_share = 1 / 16  # the figures below are the first design's share (the window is what is tested)
    b.measured(K, K * STEP_S)
    window = K * K * STEP_S  # 0.128 s
    for i in range(11):  # 11 arrivals 1 ms apart, the last at 10 ms
        b.arrived(i * 0.001, 1)
    assert b.steps(0.010, 8, K) == budget_steps(11, window, 0.0, STEP_S, 8, K, 1 / 16) == 3
    assert b.steps(0.013, 8, K) == budget_steps(11, window, 0.003, STEP_S, 8, K, 1 / 16) == 3  # 3 ms < G = 12.8 ms
    assert b.steps(0.030, 8, K) == budget_steps(11, window, 0.020, STEP_S, 8, K, 1 / 16) == 3  # G = 20 ms: 3.16
    assert b.steps(0.050, 8, K) == budget_steps(11, window, 0.040, STEP_S, 8, K, 1 / 16) == 4  # G = 40 ms: 4.47
    assert b.steps(window + 0.0005, 8, K) == budget_steps(10, window, window - 0.0095, STEP_S, 8, K, 1 / 16)  # one left
    assert b.steps(0.010 + window, 8, K) == K  # all left: K again
    b.arrived(1.0, 3)  # three taken at once count as three
    b.arrived(1.001, 0)  # nothing taken: nothing counted
    assert b.steps(1.001, 8, K) == budget_steps(3, window, 0.001, STEP_S, 8, K, 1 / 16) == 6


# ---- the loop ------------------------------------------------------------------------------------------------
class Clock:
    """The budget's clock in the loop test: seconds that only the test advances."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class TimedWorker(RecordingWorker):
    """A RecordingWorker whose replies report STEP_S seconds a decode step (``forward_seconds``) and that records
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
        return HeldReply(forward_response(items, TOKEN, forward_seconds=STEP_S * steps), hold=False)


@pytest.fixture(params=[True, False], ids=["adaptive", "fixed"])
def timed_loop(tokenizer, request):
    core = CacheCore(lease_seconds=30.0)
    running = grpc_server.start(lambda s: cache_pb2_grpc.add_CacheServicer_to_server(CacheServicer(core), s),
                                [CACHE_SERVICE], "127.0.0.1:0")
    cache = CacheClient(f"127.0.0.1:{running.port}", "default")
    clock = Clock()
    worker = TimedWorker(clock)
    sched = Scheduler(cache, worker, SchedulerConfig(decode_steps=K, overlap=True, adaptive_steps=request.param),
                      structlog.get_logger())
    sched.budget.clock = clock
    sched.connect()

    submit = submitter(sched, tokenizer)

    yield sched, worker, clock, submit, request.param
    cache.close()
    running.server.stop(0)


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
    for i in range(20):  # a probe every 2 ms of the test's clock, one prefill token each
        clock.t += 0.002
        probes.append(submit(f"p{i}", list(range(100 + i, 112 + i)), 1))
        for _ in range(3):
            sched.step()
    busy = [k for _, k in worker.decodes[busy_from:]]
    late = busy[len(busy) // 2:]  # 10 or more arrivals in the window: the rule gives 4 decoding requests 1-2 steps
    assert len(late) >= 10
    if adaptive:
        assert max(late) <= 2 and sched.stats["decode_steps_cut"] >= len(late), busy
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
    assert math.isfinite(sched.budget.step_s) and sched.budget.step_s == pytest.approx(STEP_S)
