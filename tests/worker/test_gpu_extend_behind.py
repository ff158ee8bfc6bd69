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
