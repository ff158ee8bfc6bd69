"""The attention backend interface and the per-batch metadata every backend reads.

Per forward pass the engine calls ``backend.plan(meta)`` (or ``backend.plan_ragged(meta)``, below) once, then the
model calls ``backend.attend(layer, q, kv_pool, new_kv=(k, v))`` in each layer after writing that layer's new K/V
into the pool. Semantics (every backend): request b's new token i (absolute position ``kv_len_b - qo_len_b + i``)
attends to slots ``kv_indices[kv_indptr[b] : kv_indptr[b] + kv_len_b - qo_len_b + i + 1]``: the whole
cached prefix, and causally within the new tokens. Softmax scale is ``sm_scale``.

Ragged prefill (``ragged_prefill`` True: flashinfer's eager backend): for a batch with no cached prefix
(``attention.ragged``) ``plan_ragged`` replaces ``plan``, and ``attend`` then reads the new tokens' K/V from
``new_kv`` (views of the projection output) instead of gathering them from the pool: the same keys and values,
since the pool holds copies of them.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np
import torch

from worker_svc.forward_batch import BatchLayout
from worker_svc.step_feed import pinned


@dataclass(frozen=True)
class AttentionMeta:
    """Device tensors of a BatchLayout. qo_indptr, kv_indptr, kv_indices, kv_last_page_len: int32."""

    qo_indptr: torch.Tensor       # [B+1]
    kv_indptr: torch.Tensor       # [B+1]
    kv_indices: torch.Tensor      # [sum kv_len]
    kv_last_page_len: torch.Tensor  # [B], all ones (page size 1)
    qo_indptr_cpu: torch.Tensor   # [B+1] host copies, page-locked on CUDA (planning reads them, and flashinfer's
                                  # ragged plan copies them to the device, without a device sync)
    kv_indptr_cpu: torch.Tensor   # [B+1]
    qo_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    is_decode: bool

    @classmethod
    def from_layout(cls, layout: BatchLayout, device: torch.device) -> "AttentionMeta":
        """Every host-to-device copy goes through page-locked memory (``step_feed.pinned``): one from pageable memory
        makes the host wait until the device drained the stream, so an extend planned while the one ahead of it
        runs (``extend_behind``) would start only after that one ended (H100 run 21 call 1: ~3 ms idle between
        chained 8,192-token extends)."""
        device = torch.device(device)
        qo, kv = (pinned(np.asarray(a, dtype=np.int32), device) for a in (layout.qo_indptr, layout.kv_indptr))

        def t(host):
            return host.to(device=device, non_blocking=True)

        return cls(
            qo_indptr=t(qo),
            kv_indptr=t(kv),
            kv_indices=t(pinned(np.asarray(layout.kv_indices, dtype=np.int32), device)),
            kv_last_page_len=torch.ones(layout.batch_size, dtype=torch.int32, device=device),
            qo_indptr_cpu=qo,
            kv_indptr_cpu=kv,
            qo_lens=layout.qo_lens,
            kv_lens=layout.kv_lens,
            is_decode=layout.is_decode,
        )


class AttentionBackend(abc.ABC):
    """Computes attention of new-token queries over K/V gathered from the pool by slot."""

    name: str = "base"
    ragged_prefill: bool = False  # has ``plan_ragged``
    writes_new_kv: bool = False  # ``attend`` writes the new tokens' K/V (``new_kv``) into the pool itself: the
    # model skips its K/V write for it (``Attention.start``'s ``write_kv``)

    def __init__(self, n_head: int, kv_heads: int, head_dim: int, sm_scale: float):
        self.n_head, self.kv_heads, self.head_dim, self.sm_scale = n_head, kv_heads, head_dim, sm_scale

    @abc.abstractmethod
    def plan(self, meta: AttentionMeta) -> None:
        """Prepares for a batch; called once per forward before any layer."""

    def plan_ragged(self, meta: AttentionMeta) -> None:
        """Prepares for a batch whose requests have no cached prefix (``kv_lens == qo_lens``), its attention read
        from ``attend``'s ``new_kv``; once per forward, like ``plan``. Only backends with ``ragged_prefill``:
        raises RuntimeError here."""
        raise RuntimeError(f"the {self.name} attention backend has no ragged prefill path")

    @abc.abstractmethod
    def attend(self, layer: int, q: torch.Tensor, kv_pool, out: torch.Tensor | None = None,
               new_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """q [T, n_head, head_dim] -> output [T, n_head, head_dim] (q's dtype), reading ``kv_pool`` layer
        ``layer``; written into ``out`` (contiguous, that shape and dtype) and returned when it is given.
        ``new_kv``: (k, v) of the T new tokens, [T, kv_heads, head_dim] each (strided views allowed), already
        written to the pool (unless ``writes_new_kv``: then this call writes them); read instead of the pool after
        ``plan_ragged``, ignored after ``plan``."""
