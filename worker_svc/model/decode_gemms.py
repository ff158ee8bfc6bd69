"""The model's projections for decode batches of few rows, CUDA only (Triton): one runner that picks, per call,
the resident-weight GEMV (``resident_gemv``: 1 to ``resident_rows`` rows), the resident-weight tensor-core GEMM for
the small projections (``resident_gemm``: up to ``mm_rows``), the split-K GEMM (``skinny_gemm``: up to
``splitk_rows``) or torch's GEMM (a projection ``only`` leaves out), with one split-K workspace for all.

Imports on a CPU-only machine (the kernels import Triton on first use).
"""

from __future__ import annotations

import torch

from worker_svc.model import resident_gemm, resident_gemv
from worker_svc.model.skinny_gemm import SplitKWorkspace, choose, splitk_linear, workspace_size


class DecodeGemms:
    """The model's projections for batches of at most ``max_rows`` rows: up to ``resident_rows`` rows through
    ``resident_gemv.resident_linear`` (the weights read before the kernel ahead ends), the others up to
    ``splitk_rows`` through ``splitk_linear``: one configuration per (rows, K, N) from ``choose``, one workspace
    sized for the largest of them. ``mm_rows`` > ``resident_rows`` (at most ``resident_gemm.MAX_ROWS``): rows above
    ``resident_rows`` up to it take ``resident_gemm`` for the weights it is meant for (``resident_gemm.takes``) before
    the split-K GEMM or torch's.

    ``shapes``: the [N, K] weight shapes it will be called with. Call as ``mm(x, linear, gelu=False)``.
    ``prefetch_blocks``: with ``pdl``, the K blocks of its weight slab each CTA prefetches into L2 before it waits
    for the kernel ahead (-1: the whole slab; ``splitk_linear``). ``only`` (None: all): a set of the [N, K] weight
    shapes (tuples) that take the split-K kernel (a shape names a projection where, as in GPTBigCode, the four
    differ); the others run torch's GEMM (``fused.mlp_up`` when ``gelu``): the per-projection A/B of
    ``worker_svc.bench --splitk-only`` (which sets ``resident_rows`` 0: rows up to it take the resident kernel
    before ``only`` is read). Raises ValueError for ``resident_rows`` outside [0, ``resident_gemv.MAX_ROWS``] or
    ``mm_rows`` outside [0, ``resident_gemm.MAX_ROWS``]."""

    def __init__(self, shapes, splitk_rows: int, device: torch.device | str, pdl: bool = False,
                 prefetch_blocks: int = -1, resident_rows: int = 0, mm_rows: int = 0):
        if not 0 <= resident_rows <= resident_gemv.MAX_ROWS:
            raise ValueError(f"resident_rows must be in [0, {resident_gemv.MAX_ROWS}] (got {resident_rows})")
        if not 0 <= mm_rows <= resident_gemm.MAX_ROWS:
            raise ValueError(f"mm_rows must be in [0, {resident_gemm.MAX_ROWS}] (got {mm_rows})")
        self.max_rows = max(splitk_rows, resident_rows, mm_rows)
        self.resident_rows, self.pdl, self.prefetch_blocks = resident_rows, pdl, prefetch_blocks
        self.splitk_rows, self.mm_rows = splitk_rows, mm_rows
        self.stream_per_sm = resident_gemv.STREAM_PER_SM  # resident_gemv.choose's grid (worker_svc.bench --resident-stream)
        self.mm_shape = resident_gemm.SHAPE  # resident_gemm.choose's (warps, block_n) (worker_svc.bench --resident-mm-shape)
        self.only: set[tuple[int, int]] | None = None
        self.sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.device = device
        self.shapes = [tuple(shape) for shape in shapes]
        self.ws = self.workspace()

    def workspace(self) -> SplitKWorkspace:
        """A workspace for the largest call the shapes, rows and ``mm_shape`` give (set ``ws`` to a new one after
        changing ``mm_shape``)."""
        rows = range(self.resident_rows + 1, self.splitk_rows + 1)
        sizes = [workspace_size(m, n, choose(m, k, n, self.sms)) for n, k in self.shapes for m in rows]
        sizes += [resident_gemm.workspace_size(m, n, resident_gemm.choose(m, k, n, *self.mm_shape))
                  for n, k in self.shapes if resident_gemm.takes(n, k)
                  for m in range(self.resident_rows + 1, self.mm_rows + 1)]
        return SplitKWorkspace(max((f for f, _ in sizes), default=1), max((t for _, t in sizes), default=1),
                               self.device)

    def __call__(self, x: torch.Tensor, linear, gelu: bool = False) -> torch.Tensor:
        """x [M, K] (M <= max_rows) -> linear(x) [M, N], tanh GELU after it when ``gelu``."""
        w = linear.weight
        if x.shape[0] <= self.resident_rows:
            cfg = resident_gemv.choose(w.shape[1], w.shape[0], self.sms, stream_per_sm=self.stream_per_sm)
            return resident_gemv.resident_linear(x, w, linear.bias, cfg, gelu=gelu, pdl=self.pdl)
        if x.shape[0] <= self.mm_rows and resident_gemm.takes(*w.shape):
            cfg = resident_gemm.choose(x.shape[0], w.shape[1], w.shape[0], *self.mm_shape)
            return resident_gemm.resident_mm_linear(x, w, linear.bias, cfg, self.ws, gelu=gelu, pdl=self.pdl)
        if x.shape[0] > self.splitk_rows or (self.only is not None and tuple(w.shape) not in self.only):
            from worker_svc.model import fused  # (fused imports nothing of this module's)

            return fused.mlp_up(x, linear) if gelu else torch.nn.functional.linear(x, w, linear.bias)
        return splitk_linear(x, w, linear.bias, choose(x.shape[0], w.shape[1], w.shape[0], self.sms), self.ws,
                             gelu=gelu, pdl=self.pdl, prefetch_blocks=self.prefetch_blocks)
