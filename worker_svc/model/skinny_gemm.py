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


# The inputs the kernel takes: 2-byte types. ``choose`` budgets shared memory at 2 bytes an element, and for
# float32 Triton's tl.dot rounds the inputs to TF32 by default (not the fp32 GEMM cuBLAS runs).
HALF_DTYPES = (torch.float16, torch.bfloat16)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
                  SPLIT, HAS_BIAS: tl.constexpr, GELU: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr,
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
        if PDL:
            # launched before the kernel ahead of it has finished: let the next one launch too, pull this
            # CTA's weight slab (which nothing before writes) into L2, then wait for the kernel ahead
            tl.extra.cuda.gdc_launch_dependents()
            w_lines = w_ptr + tl.minimum(rn, N - 1)[:, None].to(tl.int64) * K
            pf_end = k_end if PREFETCH < 0 else tl.minimum(k_end, k0 + PREFETCH * BLOCK_K)  # PREFETCH K blocks
            for k in range(k0, pf_end, BLOCK_K):
                kk = tl.minimum(k + tl.arange(0, BLOCK_K // 64)[None, :] * 64, K - 1)  # one address per 128 B
                tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [w_lines + kk],
                                          dtype=tl.int32, is_pure=False, pack=1)
            tl.extra.cuda.gdc_wait()
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
            if GELU:  # 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))), as F.gelu(approximate="tanh")
                u = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
                acc = 0.5 * acc * (2.0 - 2.0 / (1.0 + tl.exp(2.0 * u)))
            tl.store(y_ptr + out_off, acc.to(y_ptr.dtype.element_ty), mask=out_ok)
        else:
            tile = pid_m * tl.num_programs(0) + pid_n
            plane = M * N  # < 2**31: rows <= 256
            tl.store(ws_ptr + pid_k * plane + out_off, acc, mask=out_ok)
            tl.debug_barrier()
            ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
            if ticket == SPLIT - 1:
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in range(SPLIT):
                    total += tl.load(ws_ptr + s * plane + out_off, mask=out_ok, other=0.0, cache_modifier=".cg")
                if HAS_BIAS:
                    total += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
                if GELU:  # as above
                    u = 0.7978845608028654 * (total + 0.044715 * total * total * total)
                    total = 0.5 * total * (2.0 - 2.0 / (1.0 + tl.exp(2.0 * u)))
                tl.store(y_ptr + out_off, total.to(y_ptr.dtype.element_ty), mask=out_ok)
                tl.atomic_xchg(cnt_ptr + tile, 0)

    return skinny_mm


@functools.cache
def choose(m: int, k: int, n: int, sms: int) -> GemmConfig:
    """A configuration for [m, k] x [k, n] on ``sms`` SMs: about one wave of CTAs (run 9's sweep at M = 64 on
    the H200, bench/results/h200-run9/call2: the best grids were 128 CTAs of 32- or 64-column tiles), with as
    many pipeline stages (2-4) of x and W tiles as 200 KB of shared memory hold: 192 KB at 64 rows, one CTA an
    SM, which leaves no room for a programmatic dependent launch to overlap the kernel ahead
    (``bench/kernel_static.py --gemms``; smaller budgets, 72 and 100 KB, lost on the H100 in run 25)."""
    block_m = 16 if m <= 16 else 64
    block_n = 32 if n <= 4096 else 64
    tiles = -(-n // block_n) * -(-m // block_m)
    split = max(1, min(round(sms / tiles), k // 256))
    block_k = 256 if k // split >= 256 else 128
    stages = max(2, min(4, 200 * 1024 // ((block_m + block_n) * block_k * 2)))  # x and W tiles in shared memory
    return GemmConfig(block_m, block_n, block_k, split, 4, stages)


def workspace_size(m: int, n: int, cfg: GemmConfig) -> tuple[int, int]:
    """(float32 partials, int32 tile counters) a call of ``m`` rows and ``n`` output columns with ``cfg`` needs."""
    return cfg.split * m * n, _cdiv(n, cfg.block_n) * _cdiv(m, cfg.block_m)


class SplitKWorkspace:
    """The float32 partial sums and int32 tile counters that split-K calls share: ``floats`` >= split * M * N
    and ``tiles`` >= output tiles of any call made with it. Calls on one stream may share it (each one's last
    CTA sets its counters back to 0 before the next call reads them)."""

    def __init__(self, floats: int, tiles: int, device: torch.device | str):
        self.partials = torch.empty(max(floats, 1), dtype=torch.float32, device=device)
        self.counters = torch.zeros(max(tiles, 1), dtype=torch.int32, device=device)


def splitk_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: GemmConfig,
                  ws: SplitKWorkspace, gelu: bool = False, pdl: bool = False,
                  out: torch.Tensor | None = None, prefetch_blocks: int = -1) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T + bias [N] (or None), then tanh GELU when ``gelu`` (on the float32 sum, as
    the cuBLASLt epilogue of ``fused.mlp_up``) -> [M, N] in x's dtype (into ``out`` when given). ``pdl``:
    launched as a programmatic dependent launch (it may start while the kernel before it runs; it prefetches
    its weights into L2, then waits for that kernel; ``prefetch_blocks`` >= 0: only the first that many K blocks
    of its slab, -1: all of it). Raises ValueError when shapes, dtypes (float16 or bfloat16 only:
    ``HALF_DTYPES``) or the workspace do not fit."""
    m, k = x.shape
    n = weight.shape[0]
    if x.dtype not in HALF_DTYPES:  # fp32: tl.dot would round to TF32, and the tiles outgrow choose's budget
        raise ValueError(f"splitk_linear takes float16 or bfloat16 inputs, got {x.dtype}")
    k_per_split = _cdiv(_cdiv(k, cfg.split), cfg.block_k) * cfg.block_k
    split = _cdiv(k, k_per_split)  # splits that get any K (<= cfg.split: workspace_size's bound holds)
    tiles = workspace_size(m, n, cfg)[1]
    if (weight.shape[1] != k or x.dtype != weight.dtype or not weight.is_contiguous()
            or (split > 1 and (ws.partials.numel() < split * m * n or ws.counters.numel() < tiles))):
        raise ValueError(f"splitk_linear: x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} {weight.dtype}, "
                         f"split {split} over a workspace of {ws.partials.numel()} floats, {ws.counters.numel()} tiles")
    kernel = _kernel()
    x = x.contiguous()
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    grid = (_cdiv(n, cfg.block_n), split, _cdiv(m, cfg.block_m))
    kernel[grid](x, weight, bias if bias is not None else weight, y, ws.partials, ws.counters, m, n, k, k_per_split,
                 split, HAS_BIAS=bias is not None, GELU=gelu, PDL=pdl, PREFETCH=prefetch_blocks,
                 BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                 num_warps=cfg.warps, num_stages=cfg.stages, **({"launch_pdl": True} if pdl else {}))
    return y


class SkinnyLinear:
    """``y = x @ weight.T + bias`` for x [M, K] (M <= max_rows) with one configuration and its own workspace
    (bench/gemm_bench.py's sweep; the model shares one workspace, ``SplitKWorkspace``)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, max_rows: int, cfg: GemmConfig,
                 pdl: bool = False):
        self.weight, self.bias, self.cfg, self.pdl = weight, bias, cfg, pdl
        self.ws = SplitKWorkspace(*workspace_size(max_rows, weight.shape[0], cfg), weight.device)

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return splitk_linear(x, self.weight, self.bias, self.cfg, self.ws, pdl=self.pdl, out=out)
