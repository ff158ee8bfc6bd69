"""The prepared eager extend launched behind the extends ahead of it, on CUDA (``worker_svc/extend_behind.py``): on the
GPU a launch returns before the device is done (the draw's tokens come back through pinned memory, the next plan
waits for an event), so this is where the ordering of plan, launch and commit is real. The scenarios of
tests/worker/test_extend_behind.py in bf16 with flashinfer: greedy tokens, logprobs and request tables equal those
of the same extends run one by one, and a decode after them sees every commit. Skipped on the CPU CI: needs CUDA
and flashinfer (the accelerator machine)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.worker.test_extend_behind import three_chained_while_the_first_is_held, three_sent_at_once
from tests.worker.test_extend_continuation import chained_while_the_first_is_held
from tests.worker.test_gpu import _gpu_engine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and importlib.util.find_spec("flashinfer")),
                       reason="needs CUDA and flashinfer (run on the accelerator machine)"),
]


def _cuda(model_dir):
    def make(ahead: bool):
        eng = _gpu_engine(model_dir, torch.bfloat16, "flashinfer")
        eng.epoch, eng.extend_ahead = "epoch-1", ahead
        return eng
    return make


def test_extends_launched_behind_one_another_on_cuda_give_the_outputs_of_extends_run_one_by_one(model_dir, prompts,
                                                                                                  monkeypatch):
    three_chained_while_the_first_is_held(_cuda(model_dir), prompts, monkeypatch)


def test_extends_sent_at_once_on_cuda_give_the_outputs_of_extends_run_one_by_one(model_dir, prompts):
    three_sent_at_once(_cuda(model_dir), prompts)


def test_continuations_launched_behind_on_cuda_give_the_outputs_of_chunks_run_one_by_one(model_dir, prompts,
                                                                                       monkeypatch):
    """Prompts cut across chunk ends (tests/worker/test_extend_continuation.py): each continuation reads the K/V its
    earlier chunk, still pending, writes ahead of it in stream order; its table comes from that chunk's items."""
    chained_while_the_first_is_held(_cuda(model_dir), prompts, monkeypatch)


def test_enqueueing_a_prepared_extend_does_not_wait_for_the_device(model_dir, prompts):
    """The launch of an extend behind the one ahead is worth its name only if the host returns from it while the
    device is still busy: with ~0.5 s of device work queued ahead (``torch.cuda._sleep``), ``enqueue_extend`` of a
    prepared batch returns before that work ended (an event recorded before it is not complete), and its tokens are
    those of the same batch run at its turn. Red before the sampling rows were indexed with a device tensor: a
    Python list as the index was copied to the device with the host waiting for the stream (H200 run 22: ~4 ms of
    idle device between chained 8,192-token extends, the engine's lock held meanwhile)."""
    from tests.worker.test_extend_ahead import _batches, _tokens
    from worker_svc.extend_behind import enqueue_extend
    from worker_svc.step_clock import StepClock

    batch = _batches(prompts)[0]
    ref = _cuda(model_dir)(False)
    want = _tokens(ref.forward(batch, "epoch-1", seq=1))
    eng = _cuda(model_dir)(True)
    eng.forward(batch, "epoch-1", seq=1)  # the same shapes once: kernels loaded, allocator blocks in place
    eng.release([it.request_id for it in batch])
    prepared = eng._prepare_extend(batch)
    assert prepared is not None, "the batch of fresh prompts is prepared at arrival"
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s of clock cycles on the device, the host free
    busy = torch.cuda.Event()
    busy.record()
    with eng._lock:
        enqueued = enqueue_extend(eng, prepared, StepClock(eng.device))
    assert not busy.query(), "enqueue_extend waited for the device work queued ahead of it"
    enqueued.wait()
    with eng._lock:
        outputs = enqueued.finish(eng, eng.requests)
    assert [o.next_token_id for o in outputs] == want
