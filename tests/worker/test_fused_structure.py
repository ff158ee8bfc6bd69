"""The fused forward (each residual add fused with the LayerNorm after it, K and V written from the c_attn
output by one call and q passed strided, model.fused) is the same computation as the block-by-block forward. On the CPU the fused helpers run their torch definitions, so
this checks the rewiring of the blocks (which LayerNorm follows which add) exactly, in fp32."""

from __future__ import annotations

import torch

from tests.worker.helpers import cached_model
from worker_svc.attention.torch_ref import TorchAttention
from worker_svc.forward_batch import build_layout
from worker_svc.attention.base import AttentionMeta
from worker_svc.kv_pool import KVPool, geometry


def _hidden(model, cfg, ids, fuse: bool) -> torch.Tensor:
    model.fuse_norms = model.gelu_epilogue = fuse
    model.fuse_kv = fuse and cfg.multi_query
    try:
        pool = KVPool(cfg, geometry(cfg, torch.float32, kv_tokens=256), torch.float32, "cpu")
        backend = TorchAttention(cfg.n_head, cfg.kv_heads, cfg.head_dim, cfg.head_dim ** -0.5)
        layout = build_layout([0], [len(ids)], [list(range(1, len(ids) + 1))])
        backend.plan(AttentionMeta.from_layout(layout, "cpu"))
        return model(torch.tensor(ids), torch.from_numpy(layout.positions), pool, backend,
                     torch.from_numpy(layout.out_slots))
    finally:
        model.fuse_norms = model.gelu_epilogue = model.fuse_kv = False


def test_fused_forward_equals_block_forward(model_dir):
    cfg, model = cached_model(str(model_dir))
    ids = [5, 17, 3, 99, 250, 7, 7, 1]
    assert torch.equal(_hidden(model, cfg, ids, True), _hidden(model, cfg, ids, False))


def test_use_fused_kernels_stays_off_on_the_cpu(model_dir):
    _, model = cached_model(str(model_dir))
    model.use_fused_kernels()
    assert (model.fuse_norms, model.gelu_epilogue, model.fuse_kv) == (False, False, False)


def test_gelu_epilogue_switch_alone_reaches_the_mlp(model_dir, monkeypatch):
    """gelu_epilogue without fuse_norms still goes through fused.mlp_up (not silently ignored)."""
    from worker_svc.model import fused

    cfg, model = cached_model(str(model_dir))
    calls = []
    real = fused.mlp_up
    monkeypatch.setattr(fused, "mlp_up", lambda x, c_fc: calls.append(1) or real(x, c_fc))
    pool = KVPool(cfg, geometry(cfg, torch.float32, kv_tokens=64), torch.float32, "cpu")
    backend = TorchAttention(cfg.n_head, cfg.kv_heads, cfg.head_dim, cfg.head_dim ** -0.5)
    layout = build_layout([0], [3], [[1, 2, 3]])
    backend.plan(AttentionMeta.from_layout(layout, "cpu"))
    model.gelu_epilogue = True
    try:
        model(torch.tensor([4, 5, 6]), torch.from_numpy(layout.positions), pool, backend,
              torch.from_numpy(layout.out_slots))
    finally:
        model.gelu_epilogue = False
    assert len(calls) == cfg.n_layer
