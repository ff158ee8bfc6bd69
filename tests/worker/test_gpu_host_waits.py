"""Work the worker enqueues behind a busy device must not make the host wait for it (CUDA only).

A launch behind the Forward ahead (``extend_behind``, ``multistep`` launched behind) overlaps host and device only
if nothing in it synchronizes with the stream. ``torch.tensor(list, device="cuda")`` and indexing a CUDA tensor with
a Python list copy from pageable memory with the host waiting until the stream drained (PyTorch's copy without
``non_blocking``), so each such call inside a multi-step decode made every step's launch wait for the step before
it. Each test queues ~0.5 s of device work (``torch.cuda._sleep``), records an event, runs the function under test,
and asserts the event is not complete when the function returns; then checks the result against the CPU. Skipped on
the CPU CI: needs CUDA (the accelerator machine)."""

from __future__ import annotations

import pytest
import torch

from worker_svc.sampler import SampleRow, SamplingParams, draw_non_greedy, sample_async

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="needs CUDA (run on the accelerator machine)")]

SLEEP_CYCLES = 1_000_000_000  # ~0.5 s at the H100 / H200 clock


def _busy() -> torch.cuda.Event:
    """~0.5 s of device work queued, then an event behind it. Call it after the function under test ran once with
    the same shapes: a kernel's first use loads it lazily (which may synchronize), and the caching allocators'
    first blocks come from cudaMalloc / cudaHostAlloc."""
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    ev = torch.cuda.Event()
    ev.record()
    return ev


PARAMS = [SamplingParams(temperature=0.7, top_k=20), SamplingParams(),
          SamplingParams(temperature=1.0, top_p=0.9, min_p=0.05, seed=7)]
TEMPERATURE_ONLY = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.2)]  # no sort, one noise kernel


@pytest.mark.parametrize("params", [PARAMS, TEMPERATURE_ONLY], ids=["filters_and_seed", "temperature_only"])
def test_draw_non_greedy_does_not_wait_for_the_device(params):
    logits = torch.randn(len(params), 512, generator=torch.Generator().manual_seed(0))
    dev_logits = logits.cuda()
    gen = torch.Generator(device="cuda").manual_seed(1)
    positions = list(range(10, 10 + len(params)))
    draw_non_greedy(dev_logits, dev_logits.argmax(-1), params, positions, gen)  # loads the kernels
    chosen = dev_logits.argmax(-1)
    busy = _busy()
    draw_non_greedy(dev_logits, chosen, params, positions, gen)
    assert not busy.query(), "draw_non_greedy waited for the device work queued ahead of it"
    got = chosen.cpu().tolist()
    if params is PARAMS:
        assert got[1] == int(logits[1].argmax())  # the greedy row is left alone
        assert int(logits[0].topk(20).indices.eq(got[0]).sum()) == 1  # top_k=20 keeps the draw among the top 20
    assert all(0 <= t < 512 for t in got)


def test_sample_async_with_penalties_does_not_wait_for_the_device():
    logits = torch.randn(2, 512, generator=torch.Generator().manual_seed(2))
    rows = [SampleRow(params=SamplingParams(temperature=0.8, repetition_penalty=1.3, frequency_penalty=0.5),
                      history=[1, 2, 3, 3, 9], prompt_len=2, position=5, top_n=2),
            SampleRow(params=SamplingParams(repetition_penalty=1.2), history=[4, 4], prompt_len=1, position=2, top_n=0)]
    dev_logits = logits.cuda()
    sample_async(dev_logits, rows, torch.Generator(device="cuda").manual_seed(3)).results()  # loads the kernels
    busy = _busy()
    pending = sample_async(dev_logits, rows, torch.Generator(device="cuda").manual_seed(3))
    assert not busy.query(), "sample_async waited for the device work queued ahead of it"
    got = pending.results()
    want = sample_async(logits, rows, torch.Generator().manual_seed(3)).results()
    assert got[1].token_id == want[1].token_id  # greedy after the penalty: the same on both devices
    assert abs(got[1].logprob - want[1].logprob) < 1e-4
    assert len(got[0].top) == 2
