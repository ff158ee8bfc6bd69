"""The split-K GEMM's numerics on the CPU, in Triton's interpreter (``TRITON_INTERPRET=1``): split counts that do
not divide K, M not a multiple of BLOCK_M, N not a multiple of BLOCK_N, bias or none, tanh GELU, the tile
counters back at 0 after each call and the same bits on a second call (the serial fix-up's fixed order).

The interpreter runs the CTAs one after another, so this checks the arithmetic and the masks, not the memory
ordering between CTAs or PDL (no PDL here: the interpreter has no inline PTX); those are
tests/worker/test_gpu_skinny_gemm.py's. float16 only: the interpreter's bfloat16 ``tl.dot`` is wrong
(Triton 3.9: a 16x16 bf16 dot is off by ~1e10), and the kernel takes no float32."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from worker_svc.model import skinny_gemm
from worker_svc.model.skinny_gemm import GemmConfig, SplitKWorkspace, choose, splitk_linear, workspace_size

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="needs Triton importable (pip install triton; the interpreter runs on CPU)")


@pytest.fixture
def interpreted(monkeypatch):
    """The kernel built under TRITON_INTERPRET=1, and dropped again after the test (``_kernel`` is cached)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    skinny_gemm._kernel.cache_clear()
    yield
    skinny_gemm._kernel.cache_clear()


def _check(m: int, k: int, n: int, cfg: GemmConfig, bias: bool, gelu: bool) -> None:
    g = torch.Generator().manual_seed(m * 7 + k + n + cfg.split)
    x = torch.randn(m, k, generator=g).half()
    w = (torch.randn(n, k, generator=g) * k ** -0.5).half()
    b = (torch.randn(n, generator=g) * 0.1).half() if bias else None
    ws = SplitKWorkspace(*workspace_size(m, n, cfg), "cpu")
    want = F.linear(x.double(), w.double(), None if b is None else b.double())
    if gelu:
        want = F.gelu(want, approximate="tanh")
    got = splitk_linear(x, w, b, cfg, ws, gelu=gelu)
    assert got.dtype == torch.float16 and got.shape == (m, n)
    err = (got.double() - want).abs().max().item()
    assert err <= 2e-3 * max(1.0, want.abs().max().item()), (m, k, n, cfg, err)  # fp16 rounding of the output
    assert int(ws.counters.abs().sum()) == 0
    assert torch.equal(splitk_linear(x, w, b, cfg, ws, gelu=gelu), got)


@pytest.mark.parametrize("m,k,n", [(1, 300, 70), (37, 1000, 100), (17, 768, 33)])
@pytest.mark.parametrize("split", [1, 3, 7])
@pytest.mark.parametrize("bias,gelu", [(True, True), (False, False)])
def test_split_k_matches_float64_linear_in_the_interpreter(interpreted, m, k, n, split, bias, gelu):
    _check(m, k, n, GemmConfig(16 if m <= 16 else 64, 32, 128, split), bias, gelu)


@pytest.mark.parametrize("m", [1, 17, 64])
@pytest.mark.parametrize("k,n", [(768, 896), (3072, 768)])  # tiny_starcoder_py's c_attn and MLP c_proj
def test_chosen_configurations_in_the_interpreter(interpreted, m, k, n):
    _check(m, k, n, choose(m, k, n, 132), True, False)
