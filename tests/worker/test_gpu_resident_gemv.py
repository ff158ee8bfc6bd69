"""The resident-weight matrix-vector kernel (worker_svc/model/resident_gemv.py) on the GPU: values against F.linear
for the 1B's and the tiny model's projections at 1-4 rows, launched with PDL behind a PDL kernel that writes its
input inside a CUDA graph (it must read x only after that kernel), and the served model with it against without."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.worker.helpers import Driver, Req
from worker_svc.build import make_backend, make_graphs
from worker_svc.engine import Engine
from worker_svc.kv_pool import KVPool, geometry
from worker_svc.model import fused
from worker_svc.model.loader import load_model
from worker_svc.model.resident_gemv import choose, resident_linear
from worker_svc.model.decode_gemms import DecodeGemms

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and importlib.util.find_spec("triton")),
                       reason="needs CUDA and Triton (run on the accelerator machine)"),
]

SMS = 132


@pytest.mark.parametrize("k,n", [(2048, 2304), (2048, 2048), (2048, 8192), (8192, 2048), (768, 896), (3072, 768)])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("pdl", [False, True])
def test_resident_linear_matches_linear(k, n, m, pdl):
    g = torch.Generator(device="cuda").manual_seed(m + k + n)
    x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16)
    b = (torch.randn(n, generator=g, device="cuda") * 0.1).to(torch.bfloat16)
    want = F.linear(x.float(), w.float(), b.float())
    got = resident_linear(x, w, b, choose(k, n, SMS), pdl=pdl)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    cublas_err = (F.linear(x, w, b).float() - want).abs().max().item()
    assert (got.float() - want).abs().max().item() <= 2 * cublas_err + 1e-3
    assert torch.equal(resident_linear(x, w, b, choose(k, n, SMS), pdl=pdl), got)  # no cross-CTA sums: same bits


@pytest.mark.parametrize("k,n", [(2048, 8192), (8192, 2048), (3072, 768)])
@pytest.mark.parametrize("stream_per_sm", [1, 2])
@pytest.mark.parametrize("m", [1, 3])
def test_the_looping_grid_matches_linear(k, n, stream_per_sm, m):
    """``choose(stream_per_sm=)``: the 8-warp projections through a grid of CTAs that loop over their tiles (the
    tiny model's 768-column one keeps one CTA a tile); the same values as one CTA a tile, bit for bit."""
    g = torch.Generator(device="cuda").manual_seed(m + k)
    x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16)
    b = (torch.randn(n, generator=g, device="cuda") * 0.1).to(torch.bfloat16)
    cfg = choose(k, n, SMS, stream_per_sm=stream_per_sm)
    assert (cfg.ctas > 0) == (n * k >= 8 * 1024 * 1024)
    got = resident_linear(x, w, b, cfg, gelu=True, pdl=True)
    want = F.gelu(F.linear(x.float(), w.float(), b.float()), approximate="tanh")
    assert ((got.float() - want).norm() / want.norm()).item() < 1e-2
    one = resident_linear(x, w, b, choose(k, n, SMS), gelu=True, pdl=True)
    if cfg.block_n == choose(k, n, SMS).block_n:
        assert torch.equal(got, one)


@pytest.mark.parametrize("rows", [1, 4])
def test_pdl_launch_reads_x_after_the_kernel_ahead_wrote_it_in_a_graph(rows):
    """add + LayerNorm (PDL, lets the next kernel launch at its start) writes y; the resident kernel (PDL) reads
    its weights at once and y only after its wait. In a graph, replayed with new inputs, the output must be the
    same bits as the two kernels launched one after the other without PDL."""
    g = torch.Generator(device="cuda").manual_seed(rows)
    h = torch.randn(rows, 2048, generator=g, device="cuda").to(torch.bfloat16)
    a = torch.randn(rows, 2048, generator=g, device="cuda").to(torch.bfloat16)
    ln = nn.LayerNorm(2048, device="cuda", dtype=torch.bfloat16)
    up = nn.Linear(2048, 8192, device="cuda", dtype=torch.bfloat16)
    down = nn.Linear(8192, 2048, device="cuda", dtype=torch.bfloat16)
    cu, cd = choose(2048, 8192, SMS), choose(8192, 2048, SMS)
    out = torch.empty(rows, 2048, device="cuda", dtype=torch.bfloat16)

    def step(pdl: bool) -> torch.Tensor:
        _, y = fused.add_layer_norm(h, a, ln, pdl=pdl)
        mid = resident_linear(y, up.weight, up.bias, cu, gelu=True, pdl=pdl)
        return resident_linear(mid, down.weight, down.bias, cd, pdl=pdl, out=out)

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
            assert torch.equal(got, step(False)), scale


def test_decode_gemms_take_the_resident_kernel_up_to_its_rows_then_split_k_then_torch():
    lin = nn.Linear(2048, 2304, device="cuda", dtype=torch.bfloat16)
    mm = DecodeGemms([lin.weight.shape], 8, "cuda", pdl=True, resident_rows=2)
    assert mm.max_rows == 8
    g = torch.Generator(device="cuda").manual_seed(9)
    with torch.no_grad():
        for rows in (1, 2, 3, 8):
            x = torch.randn(rows, 2048, generator=g, device="cuda").to(torch.bfloat16)
            got = mm(x, lin)
            res = resident_linear(x, lin.weight, lin.bias, choose(2048, 2304, mm.sms)) if rows <= 2 else None
            assert (res is not None and torch.equal(got, res)) or rows > 2
            rel = ((got.float() - F.linear(x, lin.weight, lin.bias).float()).norm() / got.float().norm()).item()
            assert rel < 1e-2


def _engine(model_dir, resident_rows: int, mm_rows: int = 0):
    """A GPU engine over the checkpoint, CUDA graphs up to 8 rows, cuBLAS but for the resident kernels' rows."""
    dev, dtype = torch.device("cuda:0"), torch.bfloat16
    cfg, model = load_model(model_dir, dtype=dtype, device=dev)
    model.use_fused_kernels(splitk_rows=0, pdl=True, resident_rows=resident_rows, resident_mm_rows=mm_rows)
    assert (model.mm is not None) == (max(resident_rows, mm_rows) > 0)
    backend = make_backend("flashinfer", cfg, dtype, dev, 8)
    pool = KVPool(cfg, geometry(cfg, dtype, kv_tokens=16384), dtype, dev)
    eng = Engine(cfg, model, pool, backend, epoch="gpu", model_path=str(model_dir))
    eng.warmup()
    eng.graphs = make_graphs(8, cfg, model, pool, backend)
    return eng


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="needs flashinfer (the accelerator machine)")
@pytest.mark.parametrize("n_prompts", [1, 3])
def test_served_model_with_the_resident_kernel_decodes_as_without(model_dir, prompts, n_prompts):
    """Greedy over the trained default checkpoint, CUDA graphs: batches of 1 and 3 rows take the resident kernel."""
    outs = {}
    for rows in (0, 4):
        reqs = [Req(f"r{i}", p, 16) for i, p in enumerate(prompts[:n_prompts])]
        Driver(_engine(model_dir, rows), chunk=8).run(reqs)
        outs[rows] = [(r.out, r.logprobs) for r in reqs]
    agree = total = 0
    for (a, la), (b, lb) in zip(outs[4], outs[0]):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(b))
        agree, total = agree + n, total + len(b)
        assert max((abs(x - y) for x, y in zip(la[:n], lb[:n])), default=0.0) < 0.1
    print(f"resident vs cuBLAS greedy prefix agreement {agree}/{total}")
    assert agree >= 0.9 * total
