"""The resident-weight tensor-core GEMM's numerics on the CPU, in Triton's interpreter (``TRITON_INTERPRET=1``): K
not a multiple of the K span (a partial last split), N not a multiple of BLOCK_N, rows from 1 to 64 (padded to the
tile), one split and several (the ticketed fix-up in split order, its counters left at 0 for the next call), bias or
none, tanh GELU; and the input checks.

The interpreter runs the CTAs one after another and has no inline PTX, so PDL is off here; the order of the weight
loads before the wait is ``bench/kernel_static.py --gemms``'s to show (SASS) and tests/worker/test_gpu_resident_gemm.py
runs it with PDL in CUDA graphs. float16 (the interpreter's bfloat16 arithmetic is numpy's float32 with a bfloat16
store)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from worker_svc.model import resident_gemm
from worker_svc.model.resident_gemm import ResidentMMConfig, choose, resident_mm_linear, workspace_size
from worker_svc.model.skinny_gemm import SplitKWorkspace

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="needs Triton importable (pip install triton; the interpreter runs on CPU)")


@pytest.fixture
def interpreted(monkeypatch):
    """The kernel built under TRITON_INTERPRET=1, and dropped again after the test (``_kernel`` is cached)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    resident_gemm._kernel.cache_clear()
    yield
    resident_gemm._kernel.cache_clear()


def _check(m: int, k: int, n: int, cfg: ResidentMMConfig, bias: bool, gelu: bool, calls: int = 2) -> None:
    g = torch.Generator().manual_seed(m * 7 + k + n)
    x_full = torch.randn(m, k + 40, generator=g).half()
    x = x_full[:, 8:8 + k]  # rows of stride k + 40
    w = (torch.randn(n, k, generator=g) * k ** -0.5).half()
    b = (torch.randn(n, generator=g) * 0.1).half() if bias else None
    want = F.linear(x.double(), w.double(), None if b is None else b.double())
    if gelu:
        want = F.gelu(want, approximate="tanh")
    floats, tiles = workspace_size(m, n, cfg)
    ws = SplitKWorkspace(floats, tiles, "cpu")
    first = None
    for _ in range(calls):  # a second call on the same workspace: the counters were set back to 0
        got = resident_mm_linear(x, w, b, cfg, ws, gelu=gelu)
        assert got.dtype == torch.float16 and got.shape == (m, n)
        err = (got.double() - want).abs().max().item()
        assert err <= 2e-3 * max(1.0, want.abs().max().item()), (m, k, n, cfg, err)  # fp16 rounding of the output
        assert first is None or torch.equal(got, first)  # the split order is fixed: the same bits each call
        first = got
    assert int(ws.counters.abs().sum()) == 0


@pytest.mark.parametrize("m", [1, 5, 16, 33, 64])
@pytest.mark.parametrize("k,n,ks,block_n", [(300, 70, 128, 32), (512, 64, 512, 64), (768, 100, 256, 16)])
@pytest.mark.parametrize("bias,gelu", [(True, True), (False, False)])
def test_resident_mm_matches_float64_linear_in_the_interpreter(interpreted, m, k, n, ks, block_n, bias, gelu):
    bm = max(16, resident_gemm.next_pow2(m))
    _check(m, k, n, ResidentMMConfig(bm, block_n, ks, resident_gemm.next_pow2(ks), -(-k // ks), 4), bias, gelu)


def test_a_k_span_that_is_not_a_power_of_two(interpreted):
    """``ks`` 96 padded to 128: each split masks the 32 columns past its span (they belong to the next split)."""
    _check(8, 300, 40, ResidentMMConfig(16, 16, 96, 128, 4, 4), True, False)


@pytest.mark.parametrize("k,n", [(768, 896), (2048, 2304), (2048, 2048)])  # tiny's c_attn; the 1B's c_attn, c_proj
def test_chosen_configurations_in_the_interpreter(interpreted, k, n):
    _check(64, k, n, choose(64, k, n), True, False, calls=1)


def test_choose_splits_k_so_a_slab_fits_the_registers():
    cfg = choose(64, 2048, 2304, warps=8, block_n=64)  # the 1B's c_attn: 36 column tiles x 4 splits of 512
    assert cfg == ResidentMMConfig(64, 64, 512, 512, 4, 8)
    assert choose(64, 3072, 768) == ResidentMMConfig(64, 32, 1024, 1024, 3, 8)  # tiny's mlp.c_proj, SHAPE
    assert cfg.block_n * cfg.k_pad <= cfg.warps * 32 * resident_gemm.SLAB
    assert choose(5, 2048, 2048).block_m == 16 and choose(17, 2048, 2048).block_m == 32
    assert choose(64, 768, 896, warps=4, block_n=32).split == 2  # K 768 in spans of 512: the last one partial
    with pytest.raises(ValueError, match="1..64 rows"):
        choose(65, 2048, 2048)
    assert resident_gemm.takes(2304, 2048) and not resident_gemm.takes(8192, 2048)  # c_fc (33.5 MB) stays cuBLAS


def test_bad_input_raises_before_any_launch():
    cfg = choose(16, 64, 32)
    ws = SplitKWorkspace(*workspace_size(16, 32, cfg), "cpu")
    x, w = torch.zeros(16, 64).half(), torch.zeros(32, 64).half()
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        resident_mm_linear(x.float(), w.float(), None, cfg, ws)
    with pytest.raises(ValueError, match="rows"):
        resident_mm_linear(torch.zeros(17, 64).half(), w, None, cfg, ws)
    with pytest.raises(ValueError, match="does not cover"):
        resident_mm_linear(torch.zeros(16, 4096).half(), torch.zeros(32, 4096).half(), None, cfg, ws)
    with pytest.raises(ValueError, match="workspace"):
        resident_mm_linear(x, w, None, ResidentMMConfig(16, 16, 16, 16, 4, 4), ws)
