"""cuBLASLt's candidates (worker_svc/model/cublaslt.py, what bench/cublaslt_bench.py times) against float32
references on the GPU, run directly and replayed in a CUDA graph. (The served model's decode projections through
the timed candidates were removed after H200 run 22: no gain; the module stays for the survey.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from worker_svc.model import cublaslt

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on the accelerator machine)"),
]


@pytest.mark.parametrize("m,k,n,gelu", [(1, 2048, 2304, False), (64, 2048, 2048, False), (64, 2048, 8192, True),
                                        (256, 8192, 2048, False), (7, 768, 3072, True)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_candidate_matches_the_float32_projection(m, k, n, gelu, dtype):
    g = torch.Generator(device="cuda").manual_seed(m + k + n)
    lin = nn.Linear(k, n, device="cuda", dtype=dtype)
    x = torch.randn(m, k, generator=g, device="cuda").to(dtype)
    want = F.linear(x.float(), lin.weight.float(), lin.bias.float())
    want = F.gelu(want, approximate="tanh") if gelu else want
    lt = cublaslt.LtMatmul(m, k, n, dtype, bias=True, gelu=gelu)
    ws = torch.empty(lt.workspace_bytes, dtype=torch.uint8, device="cuda")
    cands = lt.candidates(8, bias_ptr=lin.bias.data_ptr())
    assert cands, "the heuristic offered no algorithm"
    for c in cands:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
        with torch.no_grad():
            got = lt.run(x, lin.weight, lin.bias, out, c, ws).float()
        rel = ((got - want).norm() / want.norm()).item()
        assert rel < 1e-2, (c.config, rel)


def test_a_candidate_replays_in_a_cuda_graph_with_new_inputs():
    lin = nn.Linear(2048, 2048, device="cuda", dtype=torch.bfloat16)
    lt = cublaslt.LtMatmul(16, 2048, 2048, torch.bfloat16)
    ws = torch.empty(lt.workspace_bytes, dtype=torch.uint8, device="cuda")
    c = lt.candidates(4, bias_ptr=lin.bias.data_ptr())[-1]
    x, out = torch.zeros(16, 2048, device="cuda", dtype=torch.bfloat16), torch.empty(16, 2048, device="cuda",
                                                                                  dtype=torch.bfloat16)
    with torch.no_grad():
        lt.run(x, lin.weight, lin.bias, out, c, ws)  # loads the kernel before the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        lt.run(x, lin.weight, lin.bias, out, c, ws)
    x.copy_(torch.randn(16, 2048, device="cuda"))
    g.replay()
    with torch.no_grad():
        want = F.linear(x.float(), lin.weight.float(), lin.bias.float())
    assert ((out.float() - want).norm() / want.norm()).item() < 1e-2

