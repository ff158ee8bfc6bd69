"""The fused kernels (worker_svc/model/fused.py) against their torch definitions, on the GPU; and the served
model with them against the model without them (greedy, the trained default checkpoint, CUDA graphs)."""

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

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and importlib.util.find_spec("triton")
                            and importlib.util.find_spec("flashinfer")),
                       reason="needs CUDA, Triton and flashinfer (run on the accelerator machine)"),
]


@pytest.mark.parametrize("rows,cols", [(1, 768), (64, 2048), (300, 2816), (256, 6144)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_add_layer_norm_matches_add_then_layer_norm(rows, cols, dtype):
    g = torch.Generator(device="cuda").manual_seed(rows + cols)
    h = torch.randn(rows, cols, generator=g, device="cuda").to(dtype) * 3
    x = torch.randn(rows, cols, generator=g, device="cuda").to(dtype)
    ln = nn.LayerNorm(cols, eps=1e-5, device="cuda", dtype=dtype)
    with torch.no_grad():
        ln.weight.copy_(1 + 0.1 * torch.randn(cols, generator=g, device="cuda"))
        ln.bias.copy_(0.05 * torch.randn(cols, generator=g, device="cuda"))
        s, y = fused.add_layer_norm(h, x, ln)
        want_s = h + x
        want_y = ln(want_s)
        exact = F.layer_norm(want_s.float(), (cols,), ln.weight.float(), ln.bias.float(), ln.eps)
    assert torch.equal(s, want_s)  # the same rounding of the sum
    # each element within one rounding of the exact value, as torch's own LayerNorm is
    ulp = exact.abs().clamp_min(2 ** -14) * (2 ** -8 if dtype == torch.bfloat16 else 2 ** -11)
    assert ((y.float() - exact).abs() <= ulp + (want_y.float() - exact).abs()).all()


def test_add_layer_norm_uses_the_modules_eps():
    # a near-constant row: the variance is far below eps, so eps decides the output
    h = torch.full((4, 1024), 2.0, device="cuda", dtype=torch.bfloat16)
    x = (torch.arange(1024, device="cuda") % 2).to(torch.bfloat16).expand(4, 1024).contiguous() * 2 ** -6
    ln = nn.LayerNorm(1024, eps=1e-2, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        _, y = fused.add_layer_norm(h, x, ln)
        want = ln(h + x)
    assert torch.allclose(y.float(), want.float(), atol=2 ** -8, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gelu_epilogue_matches_linear_then_gelu_tanh(dtype):
    g = torch.Generator(device="cuda").manual_seed(3)
    lin = nn.Linear(2048, 8192, device="cuda", dtype=dtype)
    for rows in (1, 64, 256, 1024):
        x = torch.randn(rows, 2048, generator=g, device="cuda").to(dtype)
        with torch.no_grad():
            got = fused.mlp_up(x, lin).float()
            want = F.gelu(lin(x), approximate="tanh").float()
        rel = ((got - want).norm() / want.norm()).item()
        assert rel < 1e-2, (rows, rel)


def _engine(model_dir, fused_on: bool, splitk_rows: int = 0, pdl: bool = False):
    dev, dtype = torch.device("cuda:0"), torch.bfloat16
    cfg, model = load_model(model_dir, dtype=dtype, device=dev)
    model.use_fused_kernels(norms=fused_on, gelu=fused_on, splitk_rows=splitk_rows, pdl=pdl)
    assert model.fuse_norms == fused_on and model.pdl == pdl and (model.mm is not None) == (splitk_rows > 0)
    backend = make_backend("flashinfer", cfg, dtype, dev, 8)
    pool = KVPool(cfg, geometry(cfg, dtype, kv_tokens=16384), dtype, dev)
    eng = Engine(cfg, model, pool, backend, epoch="gpu", model_path=str(model_dir))
    eng.warmup()
    eng.graphs = make_graphs(8, cfg, model, pool, backend)
    return eng


@pytest.mark.parametrize("splitk_rows,pdl", [(0, False), (0, True), (8, False), (8, True)])
def test_served_model_with_fused_kernels_decodes_as_without(model_dir, prompts, splitk_rows, pdl):
    outs = {}
    for on in (False, True):
        reqs = [Req(f"r{i}", p, 16) for i, p in enumerate(prompts)]
        eng = _engine(model_dir, True, splitk_rows, pdl) if on else _engine(model_dir, False)
        Driver(eng, chunk=8).run(reqs)
        outs[on] = [(r.out, r.logprobs) for r in reqs]
    agree = total = 0
    for (a, la), (b, lb) in zip(outs[True], outs[False]):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(b))
        agree, total = agree + n, total + len(b)
        assert max((abs(x - y) for x, y in zip(la[:n], lb[:n])), default=0.0) < 0.1
    print(f"fused vs unfused greedy prefix agreement {agree}/{total}")
    assert agree >= 0.9 * total


@pytest.mark.parametrize("rows,width,dtype", [(1, 64, torch.bfloat16), (64, 128, torch.bfloat16),
                                              (300, 128, torch.float16), (7, 128, torch.float32)])
def test_write_kv_equals_split_and_index_put(rows, width, dtype):
    g = torch.Generator(device="cuda").manual_seed(rows)
    n_embd = 16 * width
    qkv = torch.randn(rows, n_embd + 2 * width, generator=g, device="cuda").to(dtype)
    slots = torch.randperm(4 * rows + 8, generator=g, device="cuda")[:rows] + 1
    k = torch.zeros(4 * rows + 9, 1, width, device="cuda", dtype=dtype)
    v = torch.zeros_like(k)
    want_k, want_v = k.clone(), v.clone()
    want_k[slots] = qkv[:, n_embd:n_embd + width].reshape(rows, 1, width)
    want_v[slots] = qkv[:, n_embd + width:].reshape(rows, 1, width)
    fused.write_kv(qkv, k, v, slots, n_embd, width)
    assert torch.equal(k, want_k) and torch.equal(v, want_v)  # a copy: exact, and no other slot touched


@pytest.mark.parametrize("decode", [True, False])
def test_flashinfer_reads_a_strided_q_as_its_contiguous_copy(decode):
    """The fused K/V path hands attention q as a view of the c_attn output (row stride n_embd + 2 head_dim)."""
    from worker_svc.attention.base import AttentionMeta
    from worker_svc.forward_batch import build_layout
    from worker_svc.attention.flashinfer_backend import FlashInferAttention

    dev, dtype, n_head, hd = torch.device("cuda:0"), torch.bfloat16, 16, 128
    ws = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    backend = FlashInferAttention(n_head, 1, hd, hd ** -0.5, dtype, dev, ws)
    kv_lens = [37, 300, 1]
    qo = [1] * 3 if decode else [5, 17, 1]
    slot, slots = 1, []
    for n in kv_lens:
        slots.append(list(range(slot, slot + n)))
        slot += n
    layout = build_layout([n - q for n, q in zip(kv_lens, qo)], qo, slots)
    backend.plan(AttentionMeta.from_layout(layout, dev))

    class Pool:
        k = [torch.randn(slot + 1, 1, hd, device=dev).to(dtype)]
        v = [torch.randn(slot + 1, 1, hd, device=dev).to(dtype)]

        def paged(self, layer):
            return self.k[layer].unsqueeze(1), self.v[layer].unsqueeze(1)

    qkv = torch.randn(sum(qo), n_head * hd + 2 * hd, device=dev).to(dtype)
    q = qkv[:, :n_head * hd].unflatten(1, (n_head, hd))
    assert not q.is_contiguous()
    got = backend.attend(0, q, Pool())
    want = backend.attend(0, q.contiguous(), Pool())
    assert torch.equal(got, want)


@pytest.mark.parametrize("rows", [1, 64, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_greedy_pick_on_the_gpu_is_torchs_argmax(rows, dtype):
    """``model/greedy.GreedyArgmax`` (the decode graphs' greedy pick) against ``torch.argmax`` of the float32 logits,
    with equal maxima across chunks and a NaN row, at the 1B's vocabulary."""
    from worker_svc.model.greedy import BLOCK, GreedyArgmax

    g = torch.Generator(device="cuda").manual_seed(rows)
    x = (torch.randn(rows, 49152, generator=g, device="cuda") * 4).to(dtype)
    x[0, 3 * BLOCK + 1] = x[0, 5 * BLOCK] = 1000.0  # equal maxima in two chunks: the first
    if rows > 1:
        x[rows - 1, 20000] = float("nan")
    pick = GreedyArgmax(256, 49152, "cuda")
    assert pick.pick(x).tolist() == torch.argmax(x.float(), dim=-1).tolist()
