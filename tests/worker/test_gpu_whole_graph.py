"""GPU checks of the whole extend graphs (``extend_whole_graph``; the H200 accelerator machine, skipped on the CPU
CI): the captured forward of one request against eager flashinfer for several new-token counts and cached prefix
lengths in bf16, and greedy tokens of one-request serving unchanged by them."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.worker.helpers import Driver, Req
from worker_svc.attention.base import AttentionMeta
from worker_svc.build import WorkerOptions, build_engine, make_backend, make_whole_graphs
from worker_svc.engine import Engine
from worker_svc.forward_batch import build_layout
from worker_svc.kv_pool import KVPool, geometry
from worker_svc.model.loader import load_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and importlib.util.find_spec("flashinfer")),
                       reason="needs CUDA and flashinfer (run on the accelerator machine)"),
]

MAX_TOKENS = 256


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _engine(model_dir, fused: bool, splitk_rows: int, pdl: bool, prefill: str = "auto") -> Engine:
    """bf16 flashinfer engine of the default model, its workspace sized for whole graphs up to MAX_TOKENS, their
    paged prefill flashinfer's ``prefill`` backend."""
    dev, dtype = torch.device("cuda:0"), torch.bfloat16
    cfg, model = load_model(model_dir, dtype=dtype, device=dev)
    model.use_fused_kernels(norms=fused, gelu=fused, kv=fused, splitk_rows=splitk_rows, pdl=pdl)
    pool = KVPool(cfg, geometry(cfg, dtype, kv_tokens=8192), dtype, dev)
    backend = make_backend("flashinfer", cfg, dtype, dev, whole_graph_tokens=MAX_TOKENS)
    eng = Engine(cfg, model, pool, backend, epoch="gpu", model_path=str(model_dir))
    eng.warmup()
    eng.whole_graphs = make_whole_graphs(MAX_TOKENS, cfg, model, pool, backend, prefill)
    assert eng.whole_graphs is not None and len(eng.whole_graphs.graphs) == len(eng.whole_graphs.sizes)
    return eng


@pytest.mark.parametrize("fused,splitk_rows,pdl,prefill", [(False, 0, False, "auto"), (True, 64, True, "auto"),
                                                           (True, 64, True, "fa2")])
def test_whole_graphs_match_eager_flashinfer(model_dir, fused, splitk_rows, pdl, prefill):
    """t new tokens (1 to 256: below, at and just above buckets) after 0 to 1,700 cached tokens of random K/V at
    scattered slots, replayed back to back (each replay re-planned for its own lengths): hidden rows, the last
    row's logits and the K/V written equal eager flashinfer's within bf16 noise, the top token the same (or
    within 0.05 of eager's top logit). ``fa2``: the graphs' prefill splits the KV and a plan of fewer rows than
    the capture's may pick a smaller query tile than the captured kernel's (1 and 5 new tokens)."""
    eng = _engine(model_dir, fused, splitk_rows, pdl, prefill)
    pool, dev = eng.kv_pool, eng.device
    g = torch.Generator(device=dev).manual_seed(0)
    for t in pool.k + pool.v:
        t.copy_(torch.randn(t.shape, generator=g, device=dev))
    perm = (torch.randperm(8000, generator=torch.Generator().manual_seed(1)) + 1).tolist()
    for prefix in (0, 37, 1700):
        for new in (1, 5, 16, 17, 100, 200, 256):
            table = perm[:prefix + new]
            layout = build_layout([prefix], [new], [table])
            ids = torch.randint(1, eng.cfg.vocab_size, (new,), generator=torch.Generator().manual_seed(new))
            hidden, logits = eng.whole_graphs.run(layout, ids.tolist())
            hidden, logits = hidden.clone(), logits.clone()
            k_graph = torch.stack([k[table[prefix:]] for k in pool.k]).clone()
            eng.backend.plan(AttentionMeta.from_layout(layout, dev))
            want = eng.model(ids.to(dev), torch.from_numpy(layout.positions).to(dev), pool, eng.backend,
                             torch.from_numpy(layout.out_slots).to(dev))
            want_logits = eng.model.logits(want[-1:])
            k_eager = torch.stack([k[table[prefix:]] for k in pool.k])
            case = (prefix, new)
            assert _rel(hidden, want) < 2e-2 and _rel(logits, want_logits) < 2e-2, case
            assert _rel(k_graph, k_eager) < 2e-2, case
            top = logits.argmax().item()  # eager's top token, or one within a near-tie of it
            assert want_logits[0, top] >= want_logits.max() - 0.05, case


def _serve(eng: Engine, prompts) -> list[tuple[list[int], list[float]]]:
    """Each prompt alone: chunks of 9 over growing prefixes, decode steps, a retract to half its prompt and the
    re-extend over the kept prefix."""
    drv, outs = Driver(eng, chunk=9), []
    for i, p in enumerate(prompts):
        r = Req(f"a{i}", p, 16)
        drv.run([r])
        drv.retract(r, keep=len(r.prompt) // 2)
        r.max_new, r.done = len(r.out) + 8, False
        drv.run([r])
        outs.append((r.out, r.logprobs))
    return outs


def test_served_greedy_tokens_are_unchanged_by_the_whole_graphs(model_dir, prompts):
    """The worker built with extend_whole_graph (decode graphs, pieces and whole graphs, as served) against one
    without: the same greedy tokens, logprobs within bf16 noise, and the whole graphs ran the extends."""
    outs = []
    for whole in (False, True):
        opts = WorkerOptions(model_path=str(model_dir), device="cuda", dtype="bfloat16", kv_tokens=16384,
                             cuda_graph_max_batch=8, extend_graph_max_tokens=64, extend_whole_graph=whole)
        eng = build_engine(opts)
        assert (eng.whole_graphs is not None) == whole
        if whole:
            assert eng.whole_graphs.sizes == [16, 24, 32, 48, 64]
            calls, run = [0], eng.whole_graphs.run
            eng.whole_graphs.run = lambda *a: (calls.__setitem__(0, calls[0] + 1), run(*a))[1]
        outs.append(_serve(eng, prompts))
        if whole:
            assert calls[0] >= 2 * len(prompts)
    for (a, la), (b, lb) in zip(*outs):
        assert a == b
        assert max(abs(x - y) for x, y in zip(la, lb)) < 5e-2
