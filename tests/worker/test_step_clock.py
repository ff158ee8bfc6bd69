"""worker_svc.step_clock and ``ForwardResult.device_seconds``: the device time of the model's steps alone, what the
scheduler's adaptive decode steps split a decode round by (scheduler_svc/step_budget.py). On the CPU it is the
wall time of the steps: within the Forward's own time, and it grows with the steps; none when nothing ran."""

from __future__ import annotations

import time

import pytest
import torch

from tests.worker.helpers import make_engine
from worker_svc.step_clock import StepClock
from worker_svc.types import ForwardItem


def test_the_clock_times_between_start_and_stop_and_refuses_before() -> None:
    clock = StepClock(torch.device("cpu"))
    assert not clock.ran
    with pytest.raises(RuntimeError, match="before start"):
        clock.seconds()
    time.sleep(0.01)  # not counted: before start
    clock.start()
    time.sleep(0.02)
    clock.stop()
    time.sleep(0.01)  # not counted: after stop
    assert clock.ran and 0.02 <= clock.seconds() < 0.03


def test_device_seconds_lie_within_the_forward_and_grow_with_the_steps(model_dir, prompts) -> None:
    eng = make_engine(model_dir)
    free = iter(range(1, eng.kv_pool.pool_slots))
    p = prompts[0]
    first = eng.forward([ForwardItem("r", tuple(p), 0, tuple(next(free) for _ in p), has_prefix=True)], "epoch-1")
    assert 0 < first.device_seconds <= first.forward_seconds
    token, pos, per_step = first.outputs[0].next_token_id, len(p), {}
    for k in (1, 8, 1, 8):
        res = eng.forward([ForwardItem("r", (token,), pos, tuple(next(free) for _ in range(k)), decode_steps=k)],
                          "epoch-1")
        assert 0 < res.device_seconds <= res.forward_seconds
        token, pos = res.outputs[0].next_token_id, pos + k
        per_step.setdefault(k, []).append(res.device_seconds)
    assert min(per_step[8]) > 3 * max(per_step[1])  # eight steps: several times one step's device time


def test_a_forward_whose_items_are_all_skipped_ran_no_step(model_dir, prompts) -> None:
    eng = make_engine(model_dir)
    free = iter(range(1, eng.kv_pool.pool_slots))
    p = prompts[0]
    out = eng.forward([ForwardItem("r", tuple(p), 0, tuple(next(free) for _ in p), has_prefix=True,
                                   stop_token_ids=tuple(range(eng.cfg.vocab_size)))], "epoch-1")
    assert out.outputs[0].sampled  # stopped: whatever it sampled is a stop id
    res = eng.forward([ForwardItem("r", (), len(p), (next(free),), input_from_last_sample=True)], "epoch-1")
    assert res.outputs[0].skipped and res.device_seconds == 0.0
