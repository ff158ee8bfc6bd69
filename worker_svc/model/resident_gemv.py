"""Matrix-vector products for decode batches of one to a few rows whose weights are read before the kernel ahead
ends, Triton, CUDA only: ``y = x @ W.T + b`` for x [M, K], M <= ``ROWS`` (1..4).

At one row a decode step's projections are weight reads (the 1B's c_attn: 9.4 MB for 9.4 MFLOP); cuBLAS takes
~6.6 us for a read of ~2.3 us (H200 run 15's ``cublaslt_bench``): the kernel's launch, its ramp to full bandwidth
and its tail, 97 times a step, none of it overlapped with the kernels around it. The weights depend on nothing the
step computes, so here each CTA, launched as a programmatic dependent launch (PDL: it may start while the kernel
ahead still runs), first lets the next kernel launch (``gdc_launch_dependents``), then issues the load of its whole
weight slab (``BLOCK_N`` rows of W, every column: ``BLOCK_N * K_PAD`` elements, ~128 a thread, held in registers),
and only then waits for the kernel ahead (``gdc_wait``) before it reads x. While one kernel runs, the CTAs of the
ones after it are already reading their weights, as far as the SMs' registers hold them (a persistent decode
"megakernel" gets the same overlap by running every layer in one kernel; this keeps one kernel a projection).

With ``ResidentConfig.ctas`` (an experiment, ``worker_svc.bench --resident-stream``) a projection larger than one
wave of CTAs holds runs on a fixed grid whose CTAs loop over their tiles, each issuing the next slab's loads before
the current slab's sums (today's one-CTA-a-tile grid of the 33.5 MB projections runs in two waves of
load-wait-sum-exit at ~1.9 TB/s on the H100, run 31).

Each CTA owns ``BLOCK_N`` whole output columns (no split-K, so no partial sums cross CTAs: deterministic, no
workspace), sums over K in float32 inside the CTA, adds the bias, applies the tanh GELU on the float32 sum when
``gelu`` (as ``fused.mlp_up``'s cuBLASLt epilogue and ``skinny_gemm``), and rounds once to x's dtype. Products are
on CUDA cores (FMA): ``ROWS`` passes over the registers, which is why it is meant for one to a few rows.

Not bit-equal to cuBLAS (another summation order). tests/worker/test_resident_gemv_interpreter.py checks it
against a float64 reference in Triton's interpreter (no PDL there), tests/worker/test_gpu_resident_gemv.py against
F.linear on the GPU, with PDL, in CUDA graphs.

Triton is imported on first use, so this module imports on a CPU-only machine.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from worker_svc.model.skinny_gemm import HALF_DTYPES

MAX_ROWS = 4  # the rows the kernel is built for at most: each row is one more pass of FMAs over the registers
PER_THREAD = 128  # weight elements a thread holds (64 registers of packed bf16), two slabs of half that when looping
# The served grid of the 16 MB+ projections: this many CTAs an SM, looping (``choose(stream_per_sm=)``). Run 32 on an
# H100 (bench/results/h200-run32/call1, call3; worker_svc.bench --resident-stream, starcoderbase-1b B = 1, GPU time of
# a decode step, alternated): 0 (one CTA a tile) 1.17 / 1.15 / 1.16 / 1.16 / 1.16 ms, 2: 1.13 / 1.12 / 1.12 / 1.12 /
# 1.12, 3: 1.22.
STREAM_PER_SM = 2


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class ResidentConfig:
    """One launch shape: output columns a CTA (``block_n``), K padded to a power of two (``k_pad``, tl.arange's
    rule), warps; ``ctas`` > 0: a grid of that many CTAs, each looping over the tiles ``pid, pid + ctas, ...`` with the
    next tile's slab loaded before the current one's sums (a stream for projections larger than one wave of CTAs
    holds); 0: one CTA a tile, every slab loaded before the wait."""

    block_n: int
    k_pad: int
    warps: int
    ctas: int = 0


@functools.cache
def choose(k: int, n: int, sms: int, stream_per_sm: int = 0) -> ResidentConfig:
    """A configuration for W [n, k] on ``sms`` SMs: 8 warps for weights of 8M elements or more (16 MB in bf16), 4
    below; ``block_n`` the largest power of two whose slab (``block_n * k_pad``) is at most ``PER_THREAD``
    elements a thread (64 registers of packed bf16) and that still gives at least ``sms`` CTAs (so a small
    projection spreads its read over every SM), at least 1. 1B shape: c_attn 8 columns (288 CTAs), c_fc 16 (512),
    mlp.c_proj 4 (512); tiny_starcoder_py's c_attn 4 (224). ``stream_per_sm`` > 0 (an experiment, run 31's
    ``--resident-stream``): weights of 8M elements or more take half the slab (two are held: the tile's and the
    next one's) and a grid of ``stream_per_sm * sms`` CTAs looping over the tiles (``ResidentConfig.ctas``)."""
    k_pad = next_pow2(k)
    warps = 8 if n * k >= 8 * 1024 * 1024 else 4
    stream = stream_per_sm > 0 and warps == 8
    block_n = max(1, (warps * 32 * (PER_THREAD // 2 if stream else PER_THREAD)) // k_pad)
    block_n = 1 << (block_n.bit_length() - 1)  # a power of two
    while block_n > 1 and -(-n // block_n) < sms:
        block_n //= 2
    tiles = -(-n // block_n)
    ctas = min(tiles, stream_per_sm * sms) if stream and tiles > stream_per_sm * sms else 0
    return ResidentConfig(block_n, k_pad, warps, ctas)


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def resident_mv(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_x, stride_y, TILES,
                    HAS_BIAS: tl.constexpr, GELU: tl.constexpr, PDL: tl.constexpr, ROWS: tl.constexpr,
                    BLOCK_N: tl.constexpr, K_PAD: tl.constexpr, LOOP: tl.constexpr):
        pid = tl.program_id(0)
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, K_PAD)
        n_ok = rn < N
        k_ok = rk < K
        if PDL:  # the next kernel may launch (and read its own weights) at once
            tl.extra.cuda.gdc_launch_dependents()
        # this CTA's (first) weight slab, issued before the wait: nothing ahead writes W or b
        w = tl.load(w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0)
        bias = tl.zeros([BLOCK_N], tl.float32)
        if HAS_BIAS:
            bias = tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
        if PDL:  # x is the kernel ahead's output
            tl.extra.cuda.gdc_wait()
        # one tile (LOOP off), or tiles pid, pid + grid, ... with the next slab's loads out before this one's sums
        step = tl.num_programs(0) if LOOP else 1
        for _ in range(pid, TILES if LOOP else pid + 1, step):
            if LOOP:
                rn_next = rn + step * BLOCK_N
                ok_next = rn_next < N  # all false past the last tile
                w_next = tl.load(w_ptr + rn_next[:, None].to(tl.int64) * K + rk[None, :],
                                 mask=ok_next[:, None] & k_ok[None, :], other=0.0)
                bias_next = tl.zeros([BLOCK_N], tl.float32)
                if HAS_BIAS:
                    bias_next = tl.load(b_ptr + rn_next, mask=ok_next, other=0.0).to(tl.float32)
            for m in tl.static_range(ROWS):
                if m < M:
                    x = tl.load(x_ptr + m * stride_x + rk, mask=k_ok, other=0.0).to(tl.float32)
                    acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1) + bias  # [BLOCK_N]
                    if GELU:  # 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))), as F.gelu(approximate="tanh")
                        u = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
                        acc = 0.5 * acc * (2.0 - 2.0 / (1.0 + tl.exp(2.0 * u)))
                    tl.store(y_ptr + m * stride_y + rn, acc.to(y_ptr.dtype.element_ty), mask=n_ok)
            if LOOP:
                w, bias, rn, n_ok = w_next, bias_next, rn_next, ok_next

    return resident_mv


def resident_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: ResidentConfig,
                    gelu: bool = False, pdl: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (1 <= M <= ``MAX_ROWS``, unit stride in K) @ weight [N, K].T + bias [N] (or None), then tanh GELU
    when ``gelu`` (on the float32 sum) -> [M, N] in x's dtype (into ``out`` when given, unit stride in N).
    ``pdl``: launched as a programmatic dependent launch (sm90; it reads its weights before it waits for the
    kernel ahead). Raises ValueError when shapes, dtypes (float16 / bfloat16 only) or strides do not fit."""
    m, k = x.shape
    n = weight.shape[0]
    if x.dtype not in HALF_DTYPES or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise ValueError(f"resident_linear takes float16 or bfloat16 x, weight and bias of one dtype, got {x.dtype}, "
                         f"{weight.dtype}, {None if bias is None else bias.dtype}")
    if not 1 <= m <= MAX_ROWS or weight.shape[1] != k or not weight.is_contiguous() or x.stride(1) != 1:
        raise ValueError(f"resident_linear: x {tuple(x.shape)} (1..{MAX_ROWS} rows, unit stride in K), weight "
                         f"{tuple(weight.shape)} (contiguous)")
    if cfg.k_pad < k:
        raise ValueError(f"resident_linear: k_pad {cfg.k_pad} < K {k}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    if y.shape != (m, n) or y.dtype != x.dtype or y.stride(1) != 1:
        raise ValueError(f"resident_linear: out must be [{m}, {n}] {x.dtype} with unit stride in N")
    tiles = -(-n // cfg.block_n)
    _kernel()[(cfg.ctas or tiles,)](x, weight, bias if bias is not None else weight, y, m, n, k, x.stride(0),
                                    y.stride(0), tiles, HAS_BIAS=bias is not None, GELU=gelu, PDL=pdl,
                                    ROWS=next_pow2(m), BLOCK_N=cfg.block_n, K_PAD=cfg.k_pad, LOOP=cfg.ctas > 0,
                                    num_warps=cfg.warps, num_stages=1, **({"launch_pdl": True} if pdl else {}))
    return y
