"""worker_svc.step_clock and ``ForwardResult.device_seconds``: the device time of the model's steps alone, what the
scheduler's adaptive decode steps split a decode round by (scheduler_svc/step_budget.py). On the CPU it is the
wall time of the steps: within the Forward's own time, and it grows with the steps; none when nothing ran."""

from __future__ import annotations

import time

import pytest
import torch

from codeserve.v1 import worker_pb2, worker_pb2_grpc
from common import grpc_server
from tests.worker.helpers import make_engine
from worker_svc.service import SERVICE_NAME, add_to_server
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
    # the first Forward of each path pays its one-time setup (65 ms for one step against 6 ms for eight warm, run
    # alone on the CPU): not counted; the least of three after it, so that a busy core does not decide
    for n, k in enumerate((1, 8) * 4):
        res = eng.forward([ForwardItem("r", (token,), pos, tuple(next(free) for _ in range(k)), decode_steps=k)],
                          "epoch-1")
        assert 0 < res.device_seconds <= res.forward_seconds
        token, pos = res.outputs[0].next_token_id, pos + k
        if n >= 2:
            per_step.setdefault(k, []).append(res.device_seconds)
    assert min(per_step[8]) > 3 * min(per_step[1])  # eight steps: several times one step's device time


def test_a_forward_whose_items_are_all_skipped_ran_no_step(model_dir, prompts) -> None:
    eng = make_engine(model_dir)
    free = iter(range(1, eng.kv_pool.pool_slots))
    p = prompts[0]
    out = eng.forward([ForwardItem("r", tuple(p), 0, tuple(next(free) for _ in p), has_prefix=True,
                                   stop_token_ids=tuple(range(eng.cfg.vocab_size)))], "epoch-1")
    assert out.outputs[0].sampled  # stopped: whatever it sampled is a stop id
    res = eng.forward([ForwardItem("r", (), len(p), (next(free),), input_from_last_sample=True)], "epoch-1")
    assert res.outputs[0].skipped and res.device_seconds == 0.0


def test_device_seconds_cross_grpc_for_one_step_multi_step_prompt_logprobs_and_skipped(model_dir, prompts) -> None:
    eng = make_engine(model_dir, epoch="e")
    running = grpc_server.start(lambda s: add_to_server(eng, s), [SERVICE_NAME], "127.0.0.1:0")
    ch = grpc_server.channel(f"127.0.0.1:{running.port}")
    stub = worker_pb2_grpc.WorkerStub(ch)
    free = iter(range(1, eng.kv_pool.pool_slots))
    fwd = lambda *items: stub.Forward(worker_pb2.ForwardRequest(expected_epoch="e", items=items), timeout=30)  # noqa: E731
    try:
        p = prompts[0]
        ext = fwd(worker_pb2.ForwardItem(request_id="a", input_ids=p, slot_ids=[next(free) for _ in p], has_prefix=True,
                                         sample=True, return_prompt_logprobs=True),  # the eager extend path
                  worker_pb2.ForwardItem(request_id="s", input_ids=p, slot_ids=[next(free) for _ in p], has_prefix=True,
                                         sample=True, stop_token_ids=range(eng.cfg.vocab_size)))
        assert len(ext.results[0].prompt_logprobs) == len(p) - 1
        assert 0 < ext.device_seconds <= ext.forward_seconds
        one = fwd(worker_pb2.ForwardItem(request_id="a", input_from_last_sample=True, position_start=len(p),
                                         slot_ids=[next(free)], sample=True))
        assert one.results[0].sampled and 0 < one.device_seconds <= one.forward_seconds
        multi = fwd(worker_pb2.ForwardItem(request_id="a", input_from_last_sample=True, position_start=len(p) + 1,
                                           slot_ids=[next(free) for _ in range(4)], sample=True, decode_steps=4),
                    worker_pb2.ForwardItem(request_id="s", input_from_last_sample=True, position_start=len(p),
                                           slot_ids=[next(free) for _ in range(4)], sample=True, decode_steps=4))
        assert len(multi.results[0].next_token_ids) == 4 and multi.results[1].skipped
        assert 0 < multi.device_seconds <= multi.forward_seconds
        skipped = fwd(worker_pb2.ForwardItem(request_id="s", input_from_last_sample=True, position_start=len(p),
                                             slot_ids=[next(free)], sample=True))
        assert skipped.results[0].skipped and skipped.device_seconds == 0.0
    finally:
        ch.close()
        running.server.stop(0)


def test_a_reset_clock_has_not_run_until_started_and_stopped_again() -> None:
    clock = StepClock(torch.device("cpu"))
    clock.start()
    clock.stop()
    clock.reset()  # the engine's one clock, before its next Forward
    assert not clock.ran
    with pytest.raises(RuntimeError, match="before start"):
        clock.seconds()
