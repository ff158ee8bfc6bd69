"""A Triton GEMM for the decode projections, ``x [M, K] @ W.T + b`` with M small (1..256 rows).

At decode batch sizes the projections are weight-bound: each weight byte is read once, so the time floor is
the weight bytes over the memory bandwidth. cuBLAS picks tiles with few CTAs for the narrow ones
(``c_attn`` 2048 -> 2304 at M = 64 ran 36 CTAs of 72x64 on the H200's 132 SMs: 11.9 us for 9.4 MB, a fifth of
the bandwidth; shared/gpu/profiles-2026-12-01). This kernel tiles N finely and, with ``split_k`` > 1, splits
K over more CTAs, each adding its float32 partial sum into a zeroed float32 buffer (``tl.atomic_add``); a
last elementwise pass adds the bias and rounds to the model dtype. With ``split_k`` = 1 it is one kernel
that stores ``acc + b`` directly.

Which configuration (and whether cuBLAS) is fastest depends on M, N, K and the GPU: ``bench/skinny_gemm.py``
measures them side by side. Triton is imported on first use, so this module imports without CUDA.
Not bit-equal to cuBLAS: the float32 sums run in another order (and with split-K, in a racing order).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GemmConfig:
    """Tile sizes of one launch: block_m x block_n outputs per CTA, block_k per step; ``split_k`` CTAs share
    the K range of a tile. ``num_warps``/``num_stages``: Triton's."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 4


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def gemm(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om, k_per_split,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m = tl.program_id(2)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        m_ok = rm[:, None] < M
        n_ok = rn[None, :] < N
        k0 = pid_k * k_per_split
        x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + (k0 + rk)[None, :]
        w_ptrs = w_ptr + rn[None, :].to(tl.int64) * stride_wn + (k0 + rk)[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(0, k_per_split, BLOCK_K):
            a = tl.load(x_ptrs, mask=m_ok, other=0.0)
            b = tl.load(w_ptrs, mask=n_ok, other=0.0)
            acc += tl.dot(a, b)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        o_ptrs = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
        if SPLIT == 1:
            bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
            tl.store(o_ptrs, (acc + bias[None, :]).to(out_ptr.dtype.element_ty), mask=m_ok & n_ok)
        else:
            tl.atomic_add(o_ptrs, acc, mask=m_ok & n_ok, sem="relaxed")

    return gemm, triton.cdiv


def fits(cfg: GemmConfig, k: int) -> bool:
    """True when ``cfg`` divides K evenly (each split a whole number of block_k steps)."""
    return k % (cfg.split_k * cfg.block_k) == 0


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, cfg: GemmConfig) -> torch.Tensor:
    """x [M, K], weight [N, K], bias [N] (one dtype, CUDA; x rows contiguous) -> x @ weight.T + bias, [M, N].

    Raises ValueError when ``cfg`` does not divide K (``fits``) or the shapes disagree."""
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k or bias.shape != (n,):
        raise ValueError(f"linear: x {tuple(x.shape)}, weight {tuple(weight.shape)}, bias {tuple(bias.shape)}")
    if not fits(cfg, k):
        raise ValueError(f"linear: K={k} is not a multiple of split_k {cfg.split_k} x block_k {cfg.block_k}")
    if x.stride(1) != 1:
        x = x.contiguous()
    gemm, cdiv = _kernel()
    grid = (cdiv(n, cfg.block_n), cfg.split_k, cdiv(m, cfg.block_m))
    if cfg.split_k == 1:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    else:
        out = torch.zeros((m, n), dtype=torch.float32, device=x.device)
    gemm[grid](x, weight, bias, out, m, n, k, x.stride(0), weight.stride(0), out.stride(0), k // cfg.split_k,
               BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT=cfg.split_k,
               num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.split_k == 1:
        return out
    return (out + bias.float()).to(x.dtype)


def candidates(m: int) -> list[GemmConfig]:
    """The configurations worth trying for M rows (block_m the smallest power of two >= M, 16 at least,
    as tl.dot needs; 64 at most, larger M tiles over M)."""
    bm = min(64, max(16, 1 << (m - 1).bit_length()))
    out = []
    for bn in (32, 64, 128):
        for bk in (64, 128):
            for split in (1, 2, 4, 8):
                for warps in (4, 8):
                    if bm * bn >= 64 * 128 and warps == 4:
                        continue
                    out.append(GemmConfig(bm, bn, bk, split, warps, 4 if bk == 64 else 3))
    return out
