"""The decode step's small projections at 5 to 64 rows with their weights read before the kernel ahead ends,
Triton, CUDA only: ``y = x @ W.T + b`` on tensor cores, split over K.

At B = 64 the 1B's c_attn (9.4 MB) and attn.c_proj (8.4 MB) take ~9.3 us each under cuBLAS for a read of ~2.2 us
at 4.1 TB/s (H200 run 25's profile: 48 of them a step, ~445 us of the 1.75 ms step): the kernel's launch, ramp and
tail, none of it overlapped with the kernels around it (cuBLAS's kernels do not start before the one ahead ends).
``resident_gemv`` removed that at one row by loading each CTA's weight slab into registers before it waits for the
kernel ahead (programmatic dependent launch); past a few rows its FMAs cost more than the read. Here the same
order, with the product on tensor cores: each CTA lets the next kernel launch, loads its slab (``BLOCK_N`` rows of W
times a ``KS``-wide span of K, ``BLOCK_N * K_PAD`` elements, loaded into registers; at up to 32 rows the compiler
also copies it on to shared memory, the ``tl.dot`` operand, before the wait: ``bench/kernel_static.py --gemms``), then
waits for the kernel ahead, reads x's span ``[M, KS]`` (from L2: the kernel ahead just wrote it) and takes one
``tl.dot``.

The grid is ``(N / BLOCK_N, SPLIT)``: the K split keeps a slab small enough to hold and x's span small enough to
read fast after the wait (each CTA reads ``M * KS`` of x). The split partials are reduced in the same kernel as in
``skinny_gemm`` (deterministic: float32 partials to a workspace, a ticket per output tile, the last CTA sums them in
split order, adds the bias, applies the tanh GELU when ``gelu``, rounds once and sets the counter back to 0).

Not bit-equal to cuBLAS (another summation order). tests/worker/test_resident_gemm_interpreter.py checks it against
a float64 reference in Triton's interpreter (no PDL there); tests/worker/test_gpu_resident_gemm.py against F.linear
on the GPU, with PDL, in a CUDA graph. Served (``build.auto_resident_mm_rows``) where run 32 measured a gain: models of
n_embd <= 1024 up to 32 rows; on the 1B it lost at 32-64 rows and tied below (``worker_svc.bench
--resident-mm-rows``).

Triton is imported on first use, so this module imports on a CPU-only machine.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from worker_svc.model.resident_gemv import next_pow2
from worker_svc.model.skinny_gemm import HALF_DTYPES, SplitKWorkspace

MAX_ROWS = 64  # rows of x a call takes: one tensor-core tile of rows
MAX_WEIGHT = 8 * 1024 * 1024  # weight elements (16 MB in bf16) it is meant for: above, cuBLAS already streams
SLAB = 128  # weight elements a thread holds before the wait (64 registers of packed bf16)
# The served CTA shape (warps, output columns). Run 32 on an H100 (bench/results/h200-run32/call2-call4, worker_svc.bench,
# GPU time of a decode step): tiny_starcoder_py B = 8 / 16 / 32 / 64 0.57 / 0.60 / 0.70 / 0.89 ms at 8 x 32, 0.58 / 0.61 /
# 0.75 / 0.98 at 4 x 16; starcoderbase-1b B = 2-16 at 8 x 64 1.40-1.61, at 8 x 32 1.50-1.70; B = 16 / 32 / 64 at 4 x 64
# 1.67 / 1.88 / 2.42, at 8 x 64 1.62 / 1.78 / 2.07.
SHAPE = (8, 32)
# The CTA shapes ``choose`` is meant for (the bench flags check against them): with these warps and output columns
# the K span, ``SLAB`` elements a thread over the columns, stays >= 128 (tl.dot takes 16 at least).
WARPS = (4, 8)
COLUMNS = (16, 32, 64, 128)


@dataclass(frozen=True)
class ResidentMMConfig:
    """One launch shape: rows of the tile (``block_m``, >= 16), output columns a CTA (``block_n``), the K span a CTA
    sums (``ks``) padded to a power of two (``k_pad``), K splits, warps."""

    block_m: int
    block_n: int
    ks: int
    k_pad: int
    split: int
    warps: int


def takes(n: int, k: int) -> bool:
    """Whether a weight [n, k] is one this kernel is meant for (at most ``MAX_WEIGHT`` elements)."""
    return n * k <= MAX_WEIGHT


@functools.cache
def choose(m: int, k: int, n: int, warps: int = SHAPE[0], block_n: int = SHAPE[1]) -> ResidentMMConfig:
    """A configuration for x [m, k] @ W[n, k].T: ``block_n`` columns a CTA, a K span of the largest
    power of two whose slab is at most ``SLAB`` elements a thread of ``warps`` warps (at most K's next power of two),
    ``block_m`` the rows padded to a power of two (at least 16, tl.dot's smallest). At ``SHAPE`` (8 warps x 32
    columns) spans of 1,024: tiny_starcoder_py's c_attn 28 tiles x 1 split, c_fc 96 x 1, mlp.c_proj 24 x 3; the 1B's
    c_attn 72 x 2. Raises ValueError for m outside [1, ``MAX_ROWS``]."""
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"resident_gemm takes 1..{MAX_ROWS} rows, got {m}")
    budget = warps * 32 * SLAB // block_n  # elements of K a column's slab may span
    ks = min(1 << (budget.bit_length() - 1), next_pow2(k))
    split = -(-k // ks)
    return ResidentMMConfig(max(16, next_pow2(m)), block_n, ks, next_pow2(ks), split, warps)


def workspace_size(m: int, n: int, cfg: ResidentMMConfig) -> tuple[int, int]:
    """(float32 partials, int32 tile counters) a call of ``m`` rows and ``n`` output columns with ``cfg`` needs."""
    return cfg.split * m * n, -(-n // cfg.block_n)


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def resident_mm(x_ptr, w_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, KS, stride_x,
                    HAS_BIAS: tl.constexpr, GELU: tl.constexpr, PDL: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, K_PAD: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        split = tl.num_programs(1)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = pid_k * KS + tl.arange(0, K_PAD)
        n_ok = rn < N
        k_ok = (tl.arange(0, K_PAD) < KS) & (rk < K)
        if PDL:  # the next kernel may launch (and read its own weights) at once
            tl.extra.cuda.gdc_launch_dependents()
        # this CTA's weight slab, issued before the wait: nothing ahead writes W
        w = tl.load(w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0)  # [BLOCK_N, K_PAD]
        if PDL:  # x is the kernel ahead's output
            tl.extra.cuda.gdc_wait()
        rm = tl.arange(0, BLOCK_M)
        m_ok = rm < M
        x = tl.load(x_ptr + rm[:, None] * stride_x + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w))  # [BLOCK_M, BLOCK_N] float32
        out_off = rm[:, None].to(tl.int64) * N + rn[None, :]
        out_ok = m_ok[:, None] & n_ok[None, :]
        last = split == 1
        total = acc
        if split > 1:
            plane = M * N  # < 2**31: rows <= 64
            tl.store(ws_ptr + pid_k * plane + out_off, acc, mask=out_ok)
            tl.debug_barrier()
            last = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel") == split - 1
            if last:  # the last CTA of the tile: the partials in split order
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in range(split):
                    total += tl.load(ws_ptr + s * plane + out_off, mask=out_ok, other=0.0, cache_modifier=".cg")
                tl.atomic_xchg(cnt_ptr + pid_n, 0)
        if last:
            if HAS_BIAS:
                total += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            if GELU:  # 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))), as F.gelu(approximate="tanh")
                u = 0.7978845608028654 * (total + 0.044715 * total * total * total)
                total = 0.5 * total * (2.0 - 2.0 / (1.0 + tl.exp(2.0 * u)))
            tl.store(y_ptr + out_off, total.to(y_ptr.dtype.element_ty), mask=out_ok)

    return resident_mm


def resident_mm_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: ResidentMMConfig,
                       ws: SplitKWorkspace, gelu: bool = False, pdl: bool = False) -> torch.Tensor:
    """x [M, K] (1 <= M <= ``cfg.block_m``, unit stride in K) @ weight [N, K].T + bias [N] (or None), then tanh
    GELU when ``gelu`` (on the float32 sum) -> a new [M, N] tensor in x's dtype. ``ws`` holds at least
    ``workspace_size(M, N, cfg)`` (calls on one stream may share it). ``pdl``: launched as a programmatic dependent
    launch (sm90; the weights are read before it waits for the kernel ahead). Raises ValueError when shapes, dtypes
    (float16 / bfloat16 only), strides or the workspace do not fit."""
    m, k = x.shape
    n = weight.shape[0]
    if x.dtype not in HALF_DTYPES or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise ValueError(f"resident_mm_linear takes float16 or bfloat16 x, weight and bias of one dtype, got "
                         f"{x.dtype}, {weight.dtype}, {None if bias is None else bias.dtype}")
    if not 1 <= m <= cfg.block_m or weight.shape[1] != k or not weight.is_contiguous() or x.stride(1) != 1:
        raise ValueError(f"resident_mm_linear: x {tuple(x.shape)} (1..{cfg.block_m} rows, unit stride in K), weight "
                         f"{tuple(weight.shape)} (contiguous)")
    if cfg.split * cfg.ks < k or cfg.k_pad < cfg.ks:
        raise ValueError(f"resident_mm_linear: {cfg} does not cover K = {k}")
    floats, tiles = workspace_size(m, n, cfg)
    if ws.partials.numel() < floats or ws.counters.numel() < tiles:
        raise ValueError(f"resident_mm_linear: the workspace holds fewer than {floats} partials / {tiles} counters")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _kernel()[(-(-n // cfg.block_n), cfg.split)](
        x, weight, bias if bias is not None else weight, y, ws.partials, ws.counters, m, n, k, cfg.ks, x.stride(0),
        HAS_BIAS=bias is not None, GELU=gelu, PDL=pdl, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, K_PAD=cfg.k_pad,
        num_warps=cfg.warps, num_stages=1, **({"launch_pdl": True} if pdl else {}))
    return y
