"""The resident-weight tensor-core GEMM (worker_svc/model/resident_gemm.py) on the GPU: values against F.linear for
the 1B's and the tiny model's small projections at 5-64 rows, the same bits call after call (the fixed split order),
launched with PDL behind a PDL kernel that writes its input inside a CUDA graph, DecodeGemms' dispatch, and the
served model with it against without."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.worker.helpers import Driver, Req
from tests.worker.test_gpu_resident_gemv import _engine
from worker_svc.model import fused
from worker_svc.model.decode_gemms import DecodeGemms
from worker_svc.model.resident_gemm import choose, resident_mm_linear, workspace_size
from worker_svc.model.skinny_gemm import SplitKWorkspace

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and importlib.util.find_spec("triton")),
                       reason="needs CUDA and Triton (run on the accelerator machine)"),
]


@pytest.mark.parametrize("k,n", [(2048, 2304), (2048, 2048), (768, 896), (768, 768)])
@pytest.mark.parametrize("m", [5, 16, 33, 64])
@pytest.mark.parametrize("pdl", [False, True])
def test_resident_mm_matches_linear(k, n, m, pdl):
    g = torch.Generator(device="cuda").manual_seed(m + k + n)
    x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16)
    b = (torch.randn(n, generator=g, device="cuda") * 0.1).to(torch.bfloat16)
    cfg = choose(m, k, n)
    ws = SplitKWorkspace(*workspace_size(m, n, cfg), "cuda")
    want = F.linear(x.float(), w.float(), b.float())
    got = resident_mm_linear(x, w, b, cfg, ws, pdl=pdl)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    cublas_err = (F.linear(x, w, b).float() - want).abs().max().item()
    assert (got.float() - want).abs().max().item() <= 2 * cublas_err + 1e-3
    assert torch.equal(resident_mm_linear(x, w, b, cfg, ws, pdl=pdl), got)  # split order fixed: the same bits
    assert int(ws.counters.abs().sum()) == 0


@pytest.mark.parametrize("rows", [16, 64])
def test_pdl_launch_reads_x_after_the_kernel_ahead_wrote_it_in_a_graph(rows):
    """add + LayerNorm (PDL) writes y; c_attn then attn.c_proj through the resident GEMM (PDL, weights read at once,
    y after the wait, the split partials and counters of one workspace shared by both). In a graph replayed with new
    inputs, the output must be the same bits as the kernels launched one after the other without PDL."""
    g = torch.Generator(device="cuda").manual_seed(rows)
    h = torch.randn(rows, 2048, generator=g, device="cuda").to(torch.bfloat16)
    a = torch.randn(rows, 2048, generator=g, device="cuda").to(torch.bfloat16)
    ln = nn.LayerNorm(2048, device="cuda", dtype=torch.bfloat16)
    qkv = nn.Linear(2048, 2304, device="cuda", dtype=torch.bfloat16)
    proj = nn.Linear(2304, 2048, device="cuda", dtype=torch.bfloat16)
    cq, cp = choose(rows, 2048, 2304), choose(rows, 2304, 2048)
    sizes = (workspace_size(rows, 2304, cq), workspace_size(rows, 2048, cp))
    ws = SplitKWorkspace(max(f for f, _ in sizes), max(t for _, t in sizes), "cuda")
    out = torch.empty(rows, 2048, device="cuda", dtype=torch.bfloat16)

    def step(pdl: bool) -> torch.Tensor:
        _, y = fused.add_layer_norm(h, a, ln, pdl=pdl)
        mid = resident_mm_linear(y, qkv.weight, qkv.bias, cq, ws, pdl=pdl)
        out.copy_(resident_mm_linear(mid, proj.weight, proj.bias, cp, ws, pdl=pdl))
        return out

    with torch.no_grad():
        step(True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(True)
        for scale in (1.0, -3.0, 0.25):
            h.mul_(scale)
            a.add_(scale)
            graph.replay()
            torch.cuda.synchronize()
            got = out.clone()
            assert torch.equal(got, step(False).clone()), scale
        assert int(ws.counters.abs().sum()) == 0


def test_decode_gemms_take_it_for_the_small_projections_between_the_gemv_and_torch():
    small = nn.Linear(2048, 2304, device="cuda", dtype=torch.bfloat16)
    big = nn.Linear(2048, 8192, device="cuda", dtype=torch.bfloat16)
    mm = DecodeGemms([small.weight.shape, big.weight.shape], 0, "cuda", pdl=True, resident_rows=1, mm_rows=64)
    assert mm.max_rows == 64
    g = torch.Generator(device="cuda").manual_seed(9)
    with torch.no_grad():
        for rows in (2, 17, 64):
            x = torch.randn(rows, 2048, generator=g, device="cuda").to(torch.bfloat16)
            cfg = choose(rows, 2048, 2304)
            assert torch.equal(mm(x, small), resident_mm_linear(x, small.weight, small.bias, cfg, mm.ws))
            assert torch.equal(mm(x, big, gelu=True), fused.mlp_up(x, big))  # 33.5 MB: torch's GEMM


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="needs flashinfer (the accelerator machine)")
def test_served_model_with_the_resident_gemm_decodes_as_without(model_dir, prompts):
    """Greedy over the trained default checkpoint, CUDA graphs: a batch of 6 rows takes the resident GEMM."""
    outs = {}
    for mm_rows in (0, 64):
        reqs = [Req(f"r{i}", p, 16) for i, p in enumerate(prompts[:6])]
        Driver(_engine(model_dir, 1, mm_rows), chunk=8).run(reqs)
        outs[mm_rows] = [(r.out, r.logprobs) for r in reqs]
    agree = total = 0
    for (a, la), (b, lb) in zip(outs[64], outs[0]):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(b))
        agree, total = agree + n, total + len(b)
        assert max((abs(x - y) for x, y in zip(la[:n], lb[:n])), default=0.0) < 0.1
    print(f"resident GEMM vs cuBLAS greedy prefix agreement {agree}/{total}")
    assert agree >= 0.9 * total
