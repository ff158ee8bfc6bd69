"""Split-K GEMM for few rows (decode batches), Triton, CUDA only: ``y = x @ W.T + b``.

At M = 1..256 rows a decode step's projections read far more weight than they compute (M = 64, K = N = 2048:
8 MB of weight for 0.5 GFLOP), so their speed is the weight read. cuBLAS's kernels for these shapes tile N
only (run 8's Nsight Compute profile of the 1B decode step: the ``c_proj`` GEMMs ran 88 CTAs on 132 SMs at
1.79 TB/s), leaving SMs idle. Here the grid is ``(N / BLOCK_N, SPLIT, M / BLOCK_M)``: ``SPLIT`` CTAs share
one output tile, each reading a contiguous 1/SPLIT of K, so a narrow projection fills every SM.

The partial sums are reduced in the same kernel, deterministically (a serial fix-up): each CTA stores its
float32 partial tile to a workspace, then takes a ticket from the tile's counter; the CTA holding the last
ticket adds the SPLIT partials in split order (0, 1, ..., SPLIT-1, the same order on every run), adds the bias
and writes the output in the model dtype, then sets the counter back to 0 so the next call (or CUDA-graph
replay) finds it clean. With ``SPLIT = 1`` the kernel writes its tile directly.

Not bit-equal to cuBLAS: float32 accumulation in a different order. tests/worker/test_gpu_fused.py compares it
with ``F.linear`` on the GPU; ``bench/gemm_bench.py`` measures it against cuBLAS per shape.

Triton is imported on first use, so this module imports on a CPU-only machine.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GemmConfig:
    """One launch shape: tile sizes (rows, output columns, K per step), K splits, warps, pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    split: int
    warps: int = 4
    stages: int = 4


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def skinny_mm(x_ptr, w_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, k_per_split,
                  SPLIT, HAS_BIAS: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m = tl.program_id(2)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        k0 = pid_k * k_per_split
        k_end = tl.minimum(k0 + k_per_split, K)
        x_rows = x_ptr + rm[:, None].to(tl.int64) * K
        w_rows = w_ptr + rn[:, None].to(tl.int64) * K
        m_ok = rm[:, None] < M
        n_ok = rn[:, None] < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k0, k_end, BLOCK_K):
            kk = k + rk[None, :]
            k_ok = kk < k_end
            x = tl.load(x_rows + kk, mask=m_ok & k_ok, other=0.0)
            w = tl.load(w_rows + kk, mask=n_ok & k_ok, other=0.0)
            acc = tl.dot(x, tl.trans(w), acc)
        out_off = rm[:, None].to(tl.int64) * N + rn[None, :]
        out_ok = (rm[:, None] < M) & (rn[None, :] < N)
        if SPLIT == 1:
            if HAS_BIAS:
                acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptr + out_off, acc.to(y_ptr.dtype.element_ty), mask=out_ok)
        else:
            tile = pid_m * tl.num_programs(0) + pid_n
            plane = M.to(tl.int64) * N
            tl.store(ws_ptr + pid_k * plane + out_off, acc, mask=out_ok)
            tl.debug_barrier()
            ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
            if ticket == SPLIT - 1:
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in range(SPLIT):
                    total += tl.load(ws_ptr + s * plane + out_off, mask=out_ok, other=0.0, cache_modifier=".cg")
                if HAS_BIAS:
                    total += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
                tl.store(y_ptr + out_off, total.to(y_ptr.dtype.element_ty), mask=out_ok)
                tl.atomic_xchg(cnt_ptr + tile, 0)

    return skinny_mm, triton.cdiv


class SkinnyLinear:
    """``y = x @ weight.T + bias`` for x [M, K] (M <= max_rows), weight [N, K], bias [N] or None, one dtype.

    Holds its float32 workspace [split, max_rows, N] and int32 tile counters, made once (CUDA-graph safe:
    nothing is allocated per call but the output). Raises ValueError for a shape it was not made for."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, max_rows: int, cfg: GemmConfig):
        if weight.dim() != 2 or not weight.is_contiguous():
            raise ValueError(f"SkinnyLinear needs a contiguous [N, K] weight, got {tuple(weight.shape)}")
        self.weight, self.bias, self.cfg, self.max_rows = weight, bias, cfg, max_rows
        n, k = weight.shape
        _, cdiv = _kernel()
        self.k_per_split = cdiv(cdiv(k, cfg.split), cfg.block_k) * cfg.block_k
        self.split = cdiv(k, self.k_per_split)  # splits that get any K
        tiles = cdiv(n, cfg.block_n) * cdiv(max_rows, cfg.block_m)
        dev = weight.device
        self.ws = torch.empty((self.split, max_rows, n), dtype=torch.float32, device=dev) if self.split > 1 else None
        self.counters = torch.zeros(tiles, dtype=torch.int32, device=dev)

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        m, k = x.shape
        n = self.weight.shape[0]
        if k != self.weight.shape[1] or m > self.max_rows or x.dtype != self.weight.dtype:
            raise ValueError(f"SkinnyLinear for [<= {self.max_rows}, {self.weight.shape[1]}] {self.weight.dtype}, "
                             f"got {tuple(x.shape)} {x.dtype}")
        kernel, cdiv = _kernel()
        x = x.contiguous()
        y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
        c = self.cfg
        grid = (cdiv(n, c.block_n), self.split, cdiv(m, c.block_m))
        kernel[grid](x, self.weight, self.bias if self.bias is not None else self.weight, y,
                     self.ws if self.ws is not None else y, self.counters, m, n, k, self.k_per_split,
                     self.split, HAS_BIAS=self.bias is not None,
                     BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
                     num_warps=c.warps, num_stages=c.stages)
        return y
