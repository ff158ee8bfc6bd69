"""Multi-query decode attention, Triton, split over the KV (GPTBigCode: one K/V head for all query heads).

A decode step's attention is a read of every running request's K and V (1B shape, B = 64, 1,152 tokens: 0.9 GB
over 24 layers); its speed is that read. Every query head of a request reads the same K/V rows, so one CTA takes
all ``n_head`` heads of one request against a span of its KV: the heads are the rows of one tensor-core tile
(``[n_head, head_dim] x [head_dim, BLOCK_N]``), each K/V row is read once per step. The grid is fixed,
``(B, splits)``: CTA ``(b, s)`` takes the s-th of ``splits`` equal spans of request b's KV (``ceil(kv_len /
splits)`` tokens, found on the device from ``kv_indptr``), so nothing is planned on the host and the launch is
capturable in a CUDA graph with any lengths. Each CTA writes its span's normalized output and log-sum-exp
(float32, base 2); a second kernel, one CTA per (request, head), merges the spans with the weights ``2^(lse_s - max lse)`` (the
split-KV merge of FlashDecoding: Dao et al., 2023, "Flash-Decoding for long-context inference"). With one split the
first kernel writes the output itself.

Semantics are ``attention.base``'s for decode batches (one new token per request, which sees its whole KV):
``q [B, n_head, head_dim]``, the pool's ``k``/``v`` ``[slots, 1, head_dim]``, ``kv_indices`` int32 slots,
``kv_indptr`` int32 ``[B+1]``. Softmax in float32 (online, base 2), output in q's dtype. Not bit-equal to
flashinfer (another summation order); tests/worker/test_mqa_decode_interpreter.py checks it against a float64
reference in Triton's interpreter, ``bench/attn_bench.py`` against flashinfer on the GPU.

Triton is imported on first use, so this module imports on a CPU-only machine.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodeConfig:
    """One launch shape: KV splits per request, KV rows per loop step, warps, pipeline stages."""

    splits: int
    block_n: int = 64
    warps: int = 4
    stages: int = 3  # the winner of 7 of run 11's 10 swept cases (bench/results/h200-run11/call5)


def splits_for(batch: int, sms: int, max_splits: int = 32) -> int:
    """KV splits per request for a batch of ``batch`` rows on ``sms`` SMs: ``ceil(4 * sms / batch)``, at most
    ``max_splits``, at least 1 (H200 run 11, context 1,152: the sweep's best were 32 splits at B = 1, 10 at B = 64,
    1-2 at B = 256; this gives 32, 9, 3)."""
    return max(1, min(max_splits, -(-4 * sms // batch)))


def decode_config(batch: int, sms: int, head_dim: int) -> DecodeConfig:
    """The launch shape of a decode-graph bucket of ``batch`` rows: ``splits_for`` (up to 64 splits at one or two
    rows, up to 32 above), 32 KV rows a loop step at one or two rows (64 above), 2 pipeline stages at one or two
    rows and for 128-wide heads that split, 3 otherwise. The winners of H200 run 12's sweep (bench/results/
    h200-run12/call1/a, context 1,152): B = 1: 64 splits, 32 rows, 2 stages for head_dim 64 and 128 (4.5 / 5.2 us
    against 5.2 / 6.7 with 32 splits, 64 rows, 3 stages); B = 64: 9 splits, 64 rows, 3 stages for head_dim 64
    (11.0 us), 2 for 128 (18.0 against 19.2); B = 256, head_dim 64: 3 splits, 64 rows, 3 stages (27.3 us).
    Heads of 128 above two rows take ``ceil(1.5 * sms / batch)`` splits (at most 32) instead (measured at B = 16,
    32, 64 only: the 1B's Triton buckets; above 64 rows it gives 1-2 splits, unmeasured): timed alone the
    kernel prefers more, but in the decode graphs (run 22 call 3, H100, the 1B, GPU time of a step with every
    bucket forced to N splits) B = 64 gave 9 -> 2.05 ms, 6 -> 2.00, 4 -> 1.95, 3 -> 2.00; B = 32 17 -> 1.89,
    6 -> 1.79, 4 -> 1.81; B = 16 flat from 4 to 32 (1.70-1.72), 2.00 at 2 splits: 132 SMs give 4, 7, 13."""
    small = batch <= 2
    splits = splits_for(batch, sms, 64 if small else 32)
    if head_dim >= 128 and not small:  # in the graphs, between the GEMMs, fewer and longer spans pay (run 22)
        splits = max(1, min(32, -(-3 * sms // (2 * batch))))  # ceil(1.5 * sms / batch)
    stages = 2 if small or (head_dim >= 128 and splits > 1) else 3
    return DecodeConfig(splits=splits, block_n=32 if small else 64, warps=4, stages=stages)


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def mqa_decode_part(q_ptr, k_ptr, v_ptr, idx_ptr, indptr_ptr, o_ptr, lse_ptr, out_ptr, new_ptr,
                        scale_log2, stride_qb, stride_qh, stride_kv, stride_ob, stride_os, stride_outb,
                        stride_outh, stride_new, H, SPLITS,
                        D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr,
                        PDL: tl.constexpr, WRITE: tl.constexpr):
        if PDL:  # launched before the kernel ahead (the K/V write) finished: let the next kernel launch (the merge,
            # or with one split the projection after attention), then wait for the one ahead
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        b = tl.program_id(0)
        s = tl.program_id(1)
        start = tl.load(indptr_ptr + b)
        n = tl.load(indptr_ptr + b + 1) - start
        per = tl.cdiv(n, SPLITS)
        lo = start + s * per
        hi = tl.minimum(lo + per, start + n)
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, D)
        mask_h = offs_h < H
        if WRITE:  # the newest token's K/V (a row of new_ptr: K, then V) into its slot, by the CTA whose span reads
            # it, before that CTA's loop reads it back (the barrier: the CTA's stores before its loads)
            last = start + n - 1
            if (lo <= last) & (last < hi):
                dst = tl.load(idx_ptr + last).to(tl.int64)
                src = new_ptr + b.to(tl.int64) * stride_new + offs_d
                tl.store(k_ptr + dst * stride_kv + offs_d, tl.load(src))
                tl.store(v_ptr + dst * stride_kv + offs_d, tl.load(src + D))
            tl.debug_barrier()
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, D], tl.float32)
        q = tl.load(q_ptr + b * stride_qb + offs_h[:, None] * stride_qh + offs_d[None, :], mask=mask_h[:, None],
                    other=0.0)  # [BLOCK_H, D]
        for off in range(lo, hi, BLOCK_N):
            offs_n = off + tl.arange(0, BLOCK_N)
            mask_n = offs_n < hi
            slot = tl.load(idx_ptr + offs_n, mask=mask_n, other=0).to(tl.int64)
            k = tl.load(k_ptr + slot[:, None] * stride_kv + offs_d[None, :], mask=mask_n[:, None], other=0.0)
            qk = tl.dot(q, tl.trans(k)) * scale_log2  # [BLOCK_H, BLOCK_N], base-2 logits
            qk = tl.where(mask_n[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))  # finite: each step has a valid row
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + slot[:, None] * stride_kv + offs_d[None, :], mask=mask_n[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        if DIRECT:
            o = acc / l_i[:, None]
            tl.store(out_ptr + b * stride_outb + offs_h[:, None] * stride_outh + offs_d[None, :],
                     o.to(out_ptr.dtype.element_ty), mask=mask_h[:, None])
        else:
            empty = l_i == 0.0  # a span past the request's end: weight 0 in the merge
            o = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l_i)[:, None])
            lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
            tl.store(o_ptr + b * stride_ob + s * stride_os + offs_h[:, None] * D + offs_d[None, :], o,
                     mask=mask_h[:, None])
            tl.store(lse_ptr + (b * SPLITS + s) * BLOCK_H + offs_h, lse)

    @triton.jit
    def mqa_decode_merge(o_ptr, lse_ptr, out_ptr, stride_ob, stride_os, stride_outb, stride_outh, SPLITS,
                         D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # as the first kernel: the projection after it may launch (and prefetch its weights)
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        b = tl.program_id(0)
        h = tl.program_id(1)  # one CTA per (request, head): the merge of one request is spread over H CTAs
        offs_s = tl.arange(0, BLOCK_S)
        offs_d = tl.arange(0, D)
        mask_s = offs_s < SPLITS
        lse = tl.load(lse_ptr + (b * SPLITS + offs_s) * BLOCK_H + h, mask=mask_s, other=float("-inf"))
        w = tl.exp2(lse - tl.max(lse, 0))  # 0 for an empty span and for the padding splits
        o = tl.load(o_ptr + b * stride_ob + offs_s[:, None] * stride_os + h * D + offs_d[None, :],
                    mask=mask_s[:, None], other=0.0)  # [BLOCK_S, D]
        res = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
        tl.store(out_ptr + b * stride_outb + h * stride_outh + offs_d, res.to(out_ptr.dtype.element_ty))

    return mqa_decode_part, mqa_decode_merge


def block_heads(n_head: int) -> int:
    """Query-head rows of the tile: the next power of two, at least 16 (tl.dot's smallest M)."""
    return max(16, 1 << (n_head - 1).bit_length())


class MQADecodeWorkspace:
    """The merge's float32 inputs for batches up to ``max_batch`` rows and ``splits`` splits: partial outputs
    ``[max_batch, splits, block_h, head_dim]`` and log-sum-exps ``[max_batch, splits, block_h]`` (allocated once, so
    a captured graph reads the same buffers on every replay). Calls on one stream may share it."""

    def __init__(self, max_batch: int, splits: int, n_head: int, head_dim: int, device: torch.device | str):
        bh = block_heads(n_head)
        self.splits = splits
        self.o = torch.empty((max_batch, splits, bh, head_dim), dtype=torch.float32, device=device)
        self.lse = torch.empty((max_batch, splits, bh), dtype=torch.float32, device=device)


def mqa_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_indices: torch.Tensor, kv_indptr: torch.Tensor,
               sm_scale: float, cfg: DecodeConfig, ws: MQADecodeWorkspace | None = None,
               out: torch.Tensor | None = None, pdl: bool = False,
               new_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Decode attention of ``q`` (``[B, n_head, head_dim]``, float16 / bfloat16, head_dim a power of two >= 16)
    over one K/V head: ``k``, ``v`` ``[slots, 1, head_dim]`` (the pool's layer, q's dtype), request b's KV the
    slots ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (int32, on q's device; every request has at least one).
    Returns ``out`` (``[B, n_head, head_dim]``, q's dtype; allocated when None). ``cfg.splits`` > 1 needs ``ws``
    (``MQADecodeWorkspace`` of at least B rows and exactly ``cfg.splits`` splits). ``pdl``: both kernels as
    programmatic dependent launches (sm90; each lets the next launch at once and waits for the one ahead before it
    reads anything, so only the launch latency overlaps: the model's other Triton kernels do the same).
    ``new_kv``: (k, v) of each request's newest token, ``[B, 1, head_dim]`` views of one buffer whose rows hold K then
    V (the ``c_attn`` output: v starts ``head_dim`` elements after k, same row stride), not yet in the pool: the
    kernel writes them into the slot each request lists last (``kv_indices[kv_indptr[b+1] - 1]``) before reading it,
    so no K/V-write kernel runs ahead of it (None: the pool holds them already). Raises ValueError for a shape,
    dtype or workspace that does not fit."""
    B, H, D = q.shape
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share float16 / bfloat16 (got {q.dtype}, {k.dtype}, {v.dtype})")
    if k.dim() != 3 or k.shape[1:] != (1, D) or v.shape != k.shape or k.stride(2) != 1 or k.stride() != v.stride():
        raise ValueError(f"k, v must be [slots, 1, {D}] with unit stride in head_dim (got {tuple(k.shape)})")
    if D < 16 or D & (D - 1) or q.stride(2) != 1:
        raise ValueError(f"head_dim must be a power of two >= 16 with unit stride (got {D})")
    if cfg.splits > 1 and (ws is None or ws.splits != cfg.splits or ws.o.shape[0] < B or ws.o.shape[2] != block_heads(H)
                           or ws.o.shape[3] != D):
        raise ValueError(f"{cfg.splits} splits need a workspace of {cfg.splits} splits and >= {B} rows")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1):
        raise ValueError(f"out must be q's shape {tuple(q.shape)} and dtype with unit stride in head_dim")
    if new_kv is not None:
        nk, nv = new_kv
        if (nk.shape != (B, 1, D) or nv.shape != nk.shape or nk.dtype != q.dtype or nk.stride(2) != 1
                or nv.stride() != nk.stride() or nv.data_ptr() != nk.data_ptr() + D * nk.element_size()):
            raise ValueError(f"new_kv must be [{B}, 1, {D}] views of one buffer, V {D} elements after K in each row")
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    part, merge = _kernels()
    bh = block_heads(H)
    direct = cfg.splits == 1
    launch = {"launch_pdl": True} if pdl else {}
    o, lse = (out, out) if direct else (ws.o, ws.lse)
    write = new_kv is not None
    part[(B, cfg.splits)](q, k, v, kv_indices, kv_indptr, o, lse, out, new_kv[0] if write else q,
                          sm_scale * math.log2(math.e),
                          q.stride(0), q.stride(1), k.stride(0), o.stride(0), 0 if direct else o.stride(1),
                          out.stride(0), out.stride(1), new_kv[0].stride(0) if write else 0, H, cfg.splits, D=D,
                          BLOCK_H=bh, BLOCK_N=cfg.block_n, DIRECT=direct, PDL=pdl, WRITE=write, num_warps=cfg.warps,
                          num_stages=cfg.stages, **launch)
    if direct:
        return out
    block_s = max(2, 1 << (cfg.splits - 1).bit_length())
    merge[(B, H)](ws.o, ws.lse, out, ws.o.stride(0), ws.o.stride(1), out.stride(0), out.stride(1), cfg.splits,
                  D=D, BLOCK_H=bh, BLOCK_S=block_s, PDL=pdl, num_warps=2, **launch)
    return out
