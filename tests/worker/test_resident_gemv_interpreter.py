"""The resident-weight matrix-vector kernel's numerics on the CPU, in Triton's interpreter (``TRITON_INTERPRET=1``):
K not a power of two (the padded, masked columns), N not a multiple of BLOCK_N, 1 to 4 rows (a row count that is
not a power of two: the static loop's guard), strided x rows and output rows, bias or none, tanh GELU.

The interpreter runs the CTAs one after another and has no inline PTX, so PDL is off here; the order of the
weight loads before the wait is ``bench/kernel_static.py``'s to show (SASS) and tests/worker/test_gpu_resident_gemv.py
runs it with PDL in CUDA graphs. float16 here (the interpreter's bfloat16 arithmetic is numpy's float32 with a
bfloat16 store; float16 is exact to what the GPU does for this kernel: loads, float32 FMAs, one rounding)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from worker_svc.model import resident_gemv
from worker_svc.model.resident_gemv import ResidentConfig, choose, resident_linear

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="needs Triton importable (pip install triton; the interpreter runs on CPU)")


@pytest.fixture
def interpreted(monkeypatch):
    """The kernel built under TRITON_INTERPRET=1, and dropped again after the test (``_kernel`` is cached)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    resident_gemv._kernel.cache_clear()
    yield
    resident_gemv._kernel.cache_clear()


def _check(m: int, k: int, n: int, cfg: ResidentConfig, bias: bool, gelu: bool, strided: bool = False) -> None:
    g = torch.Generator().manual_seed(m * 7 + k + n)
    x_full = torch.randn(m, k + 40, generator=g).half()
    x = x_full[:, 8:8 + k] if strided else x_full[:, :k].contiguous()
    w = (torch.randn(n, k, generator=g) * k ** -0.5).half()
    b = (torch.randn(n, generator=g) * 0.1).half() if bias else None
    want = F.linear(x.double(), w.double(), None if b is None else b.double())
    if gelu:
        want = F.gelu(want, approximate="tanh")
    full = torch.full((m, n + 24), float("nan")).half()
    out = full[:, :n] if strided else None
    got = resident_linear(x, w, b, cfg, gelu=gelu, out=out)
    assert got.dtype == torch.float16 and got.shape == (m, n)
    err = (got.double() - want).abs().max().item()
    assert err <= 2e-3 * max(1.0, want.abs().max().item()), (m, k, n, cfg, err)  # fp16 rounding of the output
    if strided:
        assert torch.isnan(full[:, n:]).all()  # nothing written past the output's columns


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("k,n,block_n", [(300, 70, 8), (768, 33, 4), (1024, 16, 16)])
@pytest.mark.parametrize("bias,gelu", [(True, True), (False, False)])
def test_resident_linear_matches_float64_linear_in_the_interpreter(interpreted, m, k, n, block_n, bias, gelu):
    _check(m, k, n, ResidentConfig(block_n, resident_gemv.next_pow2(k), 4), bias, gelu)


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("ctas", [1, 3, 7])
def test_a_grid_that_loops_over_the_tiles_covers_each_once(interpreted, m, ctas):
    """``ResidentConfig.ctas``: fewer CTAs than tiles (70 columns, 8 a tile: 9 tiles, the last partial), each
    looping with the next slab loaded ahead; every column written once, with the bias and GELU."""
    _check(m, 300, 70, ResidentConfig(8, 512, 4, ctas), True, True)
    _check(m, 300, 70, ResidentConfig(8, 512, 4, ctas), False, False)


@pytest.mark.parametrize("m", [1, 3])
def test_strided_rows_in_and_out(interpreted, m):
    _check(m, 768, 100, choose(768, 100, 132), True, False, strided=True)


@pytest.mark.parametrize("k,n", [(768, 896), (3072, 768), (2048, 2304)])  # tiny's c_attn, MLP c_proj; the 1B's c_attn
def test_chosen_configurations_in_the_interpreter(interpreted, k, n):
    _check(1, k, n, choose(k, n, 132), True, False)


def test_choose_fills_the_sms_and_holds_a_slab_in_registers():
    assert choose(2048, 2304, 132) == ResidentConfig(8, 2048, 4)  # 288 CTAs
    assert choose(2048, 8192, 132) == ResidentConfig(16, 2048, 8)  # 512
    assert choose(8192, 2048, 132) == ResidentConfig(4, 8192, 8)  # 512
    assert choose(768, 896, 132) == ResidentConfig(4, 1024, 4)  # 224: a small projection spreads over every SM
    for k, n in ((768, 768), (3072, 768), (6144, 24576), (24576, 6144)):
        c = choose(k, n, 132)
        assert c.block_n * c.k_pad <= c.warps * 32 * 128 and c.k_pad >= k and c.ctas == 0
        assert c.block_n == 1 or -(-n // c.block_n) >= 132
    # the stream experiment: only the 8-warp projections, half the slab, a grid of 2 CTAs an SM looping
    assert choose(2048, 8192, 132, stream_per_sm=2) == ResidentConfig(8, 2048, 8, 264)  # 1,024 tiles
    assert choose(8192, 2048, 132, stream_per_sm=2) == ResidentConfig(2, 8192, 8, 264)
    assert choose(2048, 2304, 132, stream_per_sm=2) == ResidentConfig(8, 2048, 4)  # small: one CTA a tile


def test_bad_input_is_a_value_error():
    x = torch.randn(5, 64).half()
    w = torch.randn(32, 64).half()
    cfg = choose(64, 32, 132)
    with pytest.raises(ValueError, match="rows"):
        resident_linear(x, w, None, cfg)  # 5 rows > MAX_ROWS
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        resident_linear(x[:1].float(), w.float(), None, cfg)
    with pytest.raises(ValueError, match="k_pad"):
        resident_linear(x[:1], w, None, ResidentConfig(4, 32, 4))
