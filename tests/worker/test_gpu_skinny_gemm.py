"""The split-K GEMM (worker_svc/model/skinny_gemm.py) against F.linear on the GPU: values, every split count,
CUDA-graph replays (its tile counters must be back at 0 after each call), run-to-run determinism."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from worker_svc.model.decode_gemms import DecodeGemms
from worker_svc.model.skinny_gemm import GemmConfig, SkinnyLinear

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and importlib.util.find_spec("triton")),
                       reason="needs CUDA and Triton (run on the accelerator machine)"),
]


@pytest.mark.parametrize("m,k,n", [(1, 2048, 2048), (64, 2048, 2304), (37, 8192, 2048), (256, 768, 3072)])
@pytest.mark.parametrize("split", [1, 3, 8])
@pytest.mark.parametrize("bias", [True, False])
def test_split_k_matches_linear(m, k, n, split, bias):
    g = torch.Generator(device="cuda").manual_seed(m + k + n + split)
    x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16)
    b = (torch.randn(n, generator=g, device="cuda") * 0.1).to(torch.bfloat16) if bias else None
    lin = SkinnyLinear(w, b, max_rows=256, cfg=GemmConfig(64 if m > 16 else 16, 64, 128, split))
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    got = lin(x)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    cublas_err = (F.linear(x, w, b).float() - want).abs().max().item()
    assert (got.float() - want).abs().max().item() <= 2 * cublas_err + 1e-3
    assert int(lin.ws.counters.abs().sum()) == 0
    assert torch.equal(lin(x), got)  # the same partial sums in the same order


def test_split_k_replays_in_a_cuda_graph():
    x = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16) * 2048 ** -0.5
    lin = SkinnyLinear(w, None, max_rows=64, cfg=GemmConfig(64, 64, 128, 4))
    out = torch.empty(64, 2048, device="cuda", dtype=torch.bfloat16)
    lin(x, out)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        lin(x, out)
    for scale in (1.0, -2.0, 0.5):
        x.mul_(scale)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, lin(x)), scale
    assert int(lin.ws.counters.abs().sum()) == 0


@pytest.mark.parametrize("pdl,prefetch", [(False, -1), (True, -1), (True, 2), (True, 0)])
@pytest.mark.parametrize("rows", [1, 7, 64, 200])
def test_decode_gemms_with_gelu_match_linear_then_gelu(rows, pdl, prefetch):
    g = torch.Generator(device="cuda").manual_seed(rows)
    lin = torch.nn.Linear(2048, 8192, device="cuda", dtype=torch.bfloat16)
    down = torch.nn.Linear(8192, 2048, device="cuda", dtype=torch.bfloat16)
    mm = DecodeGemms([lin.weight.shape, down.weight.shape], 256, "cuda", pdl=pdl, prefetch_blocks=prefetch)
    x = torch.randn(rows, 2048, generator=g, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        up = F.gelu(F.linear(x.float(), lin.weight.float(), lin.bias.float()), approximate="tanh")
        want = F.linear(up, down.weight.float(), down.bias.float())
        got = mm(mm(x, lin, gelu=True), down).float()
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < 1e-2, rel
    assert int(mm.ws.counters.abs().sum()) == 0


def test_decode_gemms_only_some_shapes_take_the_split_k_kernel():
    """``DecodeGemms.only`` (worker bench --splitk-only): a projection whose shape is not listed runs torch's GEMM
    (bit-equal to F.linear; its GELU through ``fused.mlp_up``), a listed one the split-K kernel."""
    from worker_svc.model import fused

    g = torch.Generator(device="cuda").manual_seed(5)
    up = torch.nn.Linear(2048, 8192, device="cuda", dtype=torch.bfloat16)
    down = torch.nn.Linear(8192, 2048, device="cuda", dtype=torch.bfloat16)
    mm = DecodeGemms([up.weight.shape, down.weight.shape], 64, "cuda")
    mm.only = {tuple(down.weight.shape)}
    x = torch.randn(64, 2048, generator=g, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        h = mm(x, up, gelu=True)
        assert torch.equal(h, fused.mlp_up(x, up))  # not listed: torch's GEMM, GELU in its epilogue
        assert torch.equal(mm(x, up), F.linear(x, up.weight, up.bias))
        got, torch_out = mm(h, down).float(), F.linear(h, down.weight, down.bias).float()
    assert 0 < ((got - torch_out).norm() / torch_out.norm()).item() < 1e-2  # listed: the split-K kernel's sums
    assert int(mm.ws.counters.abs().sum()) == 0
