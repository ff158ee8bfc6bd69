"""Decode attention of a captured decode graph through the Triton multi-query kernel (``mqa_decode``), CUDA only.

The graph-side counterpart of a flashinfer ``use_cuda_graph=True`` decode wrapper (``cuda_graph.DecodeGraphs``
with ``decode_attention="triton"``): it reads the graphs' shared ``kv_indptr`` / ``kv_indices`` device buffers
directly, so a step needs no ``plan``, only the two copies ``load_step`` makes (the host ``indptr`` from pinned
memory, the slot list device to device). The KV splits per request are fixed per batch bucket at capture
(``decode_config``), with the merge's float32 workspace allocated once per bucket. Multi-query models only
(``kv_heads == 1``: every GPTBigCode checkpoint of the family); float16 / bfloat16. With ``write_kv`` the attention
kernel also writes each row's new K/V (views of the ``c_attn`` output the model hands over) into the pool, in
place of the model's K/V-write kernel ahead of it: one kernel and one dependent launch less a layer.
"""

from __future__ import annotations

import torch

from worker_svc.attention.base import AttentionBackend, AttentionMeta
from worker_svc.attention.mqa_decode import MQADecodeWorkspace, decode_config, mqa_decode


class TritonDecodeAttention(AttentionBackend):
    """Decode-only backend of one graph bucket of ``batch`` rows. ``kv_indptr`` (int32 [batch+1]) and
    ``kv_indices`` (int32 [N]) are the graphs' device buffers; ``pdl``: the kernels as programmatic dependent
    launches (``mqa_decode``; the model's ``pdl``); ``write_kv``: ``attend`` writes the new K/V itself
    (``writes_new_kv``; the model's ``fuse_kv`` path, whose ``new_kv`` are views of one qkv buffer). Raises
    RuntimeError for kv_heads != 1, a CPU device or a dtype other than float16 / bfloat16."""

    name = "triton-decode"

    def __init__(self, n_head: int, kv_heads: int, head_dim: int, sm_scale: float, dtype: torch.dtype,
                 kv_indptr: torch.Tensor, kv_indices: torch.Tensor, batch: int, pdl: bool = False,
                 write_kv: bool = False):
        super().__init__(n_head, kv_heads, head_dim, sm_scale)
        self.writes_new_kv = write_kv
        dev = kv_indptr.device
        if kv_heads != 1 or dev.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
            raise RuntimeError(f"the Triton decode attention takes one K/V head, CUDA, float16 / bfloat16 (got "
                               f"kv_heads={kv_heads}, {dev}, {dtype})")
        self.kv_indptr, self.kv_indices, self.pdl = kv_indptr, kv_indices, pdl
        self.config = decode_config(batch, torch.cuda.get_device_properties(dev).multi_processor_count, head_dim)
        self.workspace = (MQADecodeWorkspace(batch, self.config.splits, n_head, head_dim, dev)
                          if self.config.splits > 1 else None)

    def plan(self, meta: AttentionMeta) -> None:
        """A decode batch's slot tables into the buffers (capture and tests; a replay uses ``load_step``)."""
        if not meta.is_decode:
            raise RuntimeError("the Triton decode attention takes decode batches only")
        self.load_step(meta.kv_indptr_cpu, meta.kv_indices)

    def load_step(self, kv_indptr_host: torch.Tensor, kv_indices: torch.Tensor) -> None:
        """One step's ``kv_indptr`` (int32 [batch+1], pinned host) and ``kv_indices`` (int32 device, its first
        ``kv_indptr[-1]`` entries) into the buffers the captured kernels read; nothing waits for the GPU."""
        self.kv_indptr.copy_(kv_indptr_host, non_blocking=True)
        self.kv_indices[:kv_indices.numel()].copy_(kv_indices, non_blocking=True)

    def attend(self, layer: int, q: torch.Tensor, kv_pool, out: torch.Tensor | None = None,
               new_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """See ``AttentionBackend.attend``; reads the pool, and first writes ``new_kv`` into it when
        ``writes_new_kv`` (RuntimeError when they are missing then)."""
        if self.writes_new_kv and new_kv is None:
            raise RuntimeError("the Triton decode attention writes the new K/V: attend needs them (new_kv)")
        return mqa_decode(q, kv_pool.k[layer], kv_pool.v[layer], self.kv_indices, self.kv_indptr, self.sm_scale,
                          self.config, self.workspace, out, pdl=self.pdl,
                          new_kv=new_kv if self.writes_new_kv else None)
