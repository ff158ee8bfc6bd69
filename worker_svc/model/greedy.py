"""Greedy pick of a decode step on the device, Triton, CUDA only: ``argmax`` of each row of the logits in the model's
dtype, inside the decode graphs.

Before, each decode graph ended in a cast of the logits to float32 (``[B, vocab]``: at B = 64 and the 1B's 49,152
entries, 12.6 MB written, 8.3 us on the H200) and each step ran torch's argmax after the replay (one CTA a row, 12.6
us at B = 64: H200 run 25's profile, ``bench/results/h200-run25/call4``). Here the graph keeps the logits in the
model's dtype and picks the greedy token itself, over ``ceil(vocab / BLOCK)`` CTAs a row: a first kernel finds each
chunk's maximum and the first index holding it (and the first NaN's index), a second one takes, per row, the first
NaN when there is one, else the first chunk's index holding the row's maximum.

Same indices as ``torch.argmax(x.float(), dim=-1)`` on every input: a float16 / bfloat16 value is exact in float32,
the first of equal maxima wins (chunks are in index order, each chunk's first index), and NaN counts as the maximum
(torch's rule: the first NaN). tests/worker/test_greedy_interpreter.py checks that in Triton's interpreter, and
tests/worker/test_gpu.py's graph == eager cases on the GPU.

Triton is imported on first use, so this module imports on a CPU-only machine.
"""

from __future__ import annotations

import functools

import torch

BLOCK = 4096  # vocab entries a CTA reads: 12 CTAs a row for the 49,152-entry vocabulary


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def chunk_argmax(x_ptr, val_ptr, idx_ptr, nan_ptr, V, stride_x, CHUNKS, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        c = tl.program_id(1)
        offs = c * BLOCK + tl.arange(0, BLOCK)
        ok = offs < V
        x = tl.load(x_ptr + row.to(tl.int64) * stride_x + offs, mask=ok, other=float("-inf")).to(tl.float32)
        big = 2147483647
        isnan = (x != x) & ok
        first_nan = tl.min(tl.where(isnan, offs, big), 0)
        x = tl.where(isnan, float("-inf"), x)
        m = tl.max(x, 0)
        first = tl.min(tl.where(ok & (x == m), offs, big), 0)
        out = row * CHUNKS + c
        tl.store(val_ptr + out, m)
        tl.store(idx_ptr + out, first)
        tl.store(nan_ptr + out, first_nan)

    @triton.jit
    def combine(val_ptr, idx_ptr, nan_ptr, out_ptr, CHUNKS, BLOCK_C: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK_C)
        ok = offs < CHUNKS
        big = 2147483647
        v = tl.load(val_ptr + row * CHUNKS + offs, mask=ok, other=float("-inf"))
        i = tl.load(idx_ptr + row * CHUNKS + offs, mask=ok, other=big)
        n = tl.load(nan_ptr + row * CHUNKS + offs, mask=ok, other=big)
        first_nan = tl.min(n, 0)
        m = tl.max(v, 0)
        first = tl.min(tl.where(ok & (v == m), i, big), 0)
        tl.store(out_ptr + row, tl.where(first_nan < big, first_nan, first).to(tl.int64))

    return chunk_argmax, combine


class GreedyArgmax:
    """Row-wise argmax of logits ``x`` [n, V] (n <= ``max_rows``, any float dtype, last dim contiguous) into its own
    int64 buffer ``out`` [max_rows] (a captured graph reads and writes the same buffers on every replay): call
    ``pick(x)`` -> ``out[:n]``. ``vocab``: V. The partial maxima take 12 bytes a (row, chunk)."""

    def __init__(self, max_rows: int, vocab: int, device: torch.device | str):
        self.vocab, self.chunks = vocab, -(-vocab // BLOCK)
        self.val = torch.empty(max_rows * self.chunks, dtype=torch.float32, device=device)
        self.idx = torch.empty(max_rows * self.chunks, dtype=torch.int32, device=device)
        self.nan = torch.empty(max_rows * self.chunks, dtype=torch.int32, device=device)
        self.out = torch.zeros(max_rows, dtype=torch.int64, device=device)

    def pick(self, x: torch.Tensor) -> torch.Tensor:
        """``x.float().argmax(-1)`` as int64 [n] (a view of ``out``). Raises ValueError for a shape that does not fit."""
        n, v = x.shape
        if v != self.vocab or n > self.out.shape[0] or x.stride(1) != 1 or not x.is_floating_point():
            raise ValueError(f"GreedyArgmax of {self.out.shape[0]} rows x {self.vocab}: got {tuple(x.shape)} {x.dtype} "
                             f"strides {x.stride()}")
        chunk_argmax, combine = _kernels()
        chunk_argmax[(n, self.chunks)](x, self.val, self.idx, self.nan, v, x.stride(0), self.chunks, BLOCK=BLOCK,
                                       num_warps=4)
        combine[(n,)](self.val, self.idx, self.nan, self.out, self.chunks,
                      BLOCK_C=max(16, 1 << (self.chunks - 1).bit_length()), num_warps=1)
        return self.out[:n]
