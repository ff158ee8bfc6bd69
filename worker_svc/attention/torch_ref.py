"""Reference attention in plain torch (CPU and GPU): gathers each request's K/V by slot.

Scores and softmax in float32; output cast back to the query dtype. One request at a time: clear rather
than fast.
"""

from __future__ import annotations

import torch

from worker_svc.attention.base import AttentionBackend, AttentionMeta


class TorchAttention(AttentionBackend):
    """See ``attention.base`` for the semantics."""

    name = "torch"

    def plan(self, meta: AttentionMeta) -> None:
        self.meta = meta
        self._kv_ranges = meta.kv_indptr.tolist()
        self._qo_ranges = meta.qo_indptr.tolist()
        self._idx = meta.kv_indices.long()
        # Causal masks per distinct (qo_len, kv_len), shared by layers: True where a key is visible.
        self._masks: dict[tuple[int, int], torch.Tensor] = {}
        for n, kv in zip(meta.qo_lens, meta.kv_lens):
            if n > 1 and (n, kv) not in self._masks:
                q_pos = torch.arange(kv - n, kv, device=self._idx.device)[:, None]  # [n, 1]
                k_pos = torch.arange(kv, device=self._idx.device)[None, :]  # [1, kv]
                self._masks[(n, kv)] = k_pos <= q_pos  # [n, kv]

    def attend(self, layer: int, q: torch.Tensor, kv_pool, out: torch.Tensor | None = None,
               new_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """See ``AttentionBackend.attend``; reads the pool (``new_kv`` unused: no ragged path)."""
        k_all, v_all = kv_pool.k[layer], kv_pool.v[layer]  # [slots, kv_heads, head_dim]
        out = torch.empty_like(q) if out is None else out  # [T, n_head, head_dim]
        group = self.n_head // self.kv_heads
        for b, (n, kv) in enumerate(zip(self.meta.qo_lens, self.meta.kv_lens)):
            idx = self._idx[self._kv_ranges[b]:self._kv_ranges[b + 1]]  # [kv]
            k = k_all[idx].float()  # [kv, kv_heads, head_dim]
            v = v_all[idx].float()
            qb = q[self._qo_ranges[b]:self._qo_ranges[b + 1]].float()  # [n, n_head, head_dim]
            qb = qb.reshape(n, self.kv_heads, group, self.head_dim)  # query head h uses kv head h // group
            s = torch.einsum("nkgd,lkd->kgnl", qb, k) * self.sm_scale  # [kv_heads, group, n, kv]
            if n > 1:
                s = s.masked_fill(~self._masks[(n, kv)], float("-inf"))
            p = torch.softmax(s, dim=-1)
            o = torch.einsum("kgnl,lkd->nkgd", p, v)  # [n, kv_heads, group, head_dim]
            out[self._qo_ranges[b]:self._qo_ranges[b + 1]] = o.reshape(n, self.n_head, self.head_dim).to(q.dtype)
        return out
