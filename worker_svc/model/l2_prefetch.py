"""The next projection's weights read into L2 on a side stream of a captured decode graph.

At decode batch sizes each projection is a read of its weights (the 1B: 8.4-33.6 MB each, 97 GEMMs a step), and
each GEMM kernel is a few microseconds long: its ramp-up and tail leave HBM idle (H200 run 15, B = 64: the GEMMs read
at 1.98 TB/s against the lm_head's 3.8; bench/README.md "Run 22"). The weights do not depend on the activations, so
they can be read ahead: ``WeightPrefetch.at(j)``, called just before projection j is enqueued, forks a side stream
from the capture stream that loads projection ``j + distance``'s weights with the ``evict_last`` L2 policy (a Triton
kernel: a load and nothing stored), and makes projection j wait (an event) for the read of its own weights, so
projection j finds them in L2 (50 MB on the H100 / H200). ``bench/l2_prefetch_bench.py`` measures the same
sequence without the model.

Only inside a CUDA graph capture (``torch.cuda.is_current_stream_capturing``) and for batches of at most
``max_rows`` rows: eager steps and larger batches run as without it. Projections are numbered in step order,
``4 * layer + k`` with k = 0 c_attn, 1 attn.c_proj, 2 c_fc, 3 mlp.c_proj. Triton is imported on first use.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def _touch_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def touch(w_ptr, n, sink_ptr, BLOCK: tl.constexpr):
        """Loads BLOCK int32 of w per program with evict_last; stores one sum only in the (never expected) case it
        equals a sentinel, so the loads are kept and nothing else is written."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(w_ptr + offs, mask=offs < n, other=0, eviction_policy="evict_last")
        s = tl.sum(x, axis=0)
        if s == -1234567891:
            tl.store(sink_ptr, s)

    return touch


def touch(w: torch.Tensor, sink: torch.Tensor, block: int = 8192) -> None:
    """Reads every byte of ``w`` (contiguous, CUDA, a multiple of 4 bytes) into L2 with the evict_last policy;
    ``sink``: one int32 on w's device, never written in practice."""
    flat = w.view(torch.int32).view(-1)
    n = flat.numel()
    _touch_kernel()[(-(-n // block),)](flat, n, sink, BLOCK=block, num_warps=8)


class WeightPrefetch:
    """Reads projection j + ``distance``'s weights into L2 while projection j runs, in captured decode graphs.

    ``weights``: the projections' weight tensors in step order (contiguous, CUDA); ``max_rows``: batches of more
    rows run without it (their GEMMs are compute-bound); ``distance`` >= 1. ``reader`` (tests): called as
    ``reader(weight)`` on the side stream instead of ``touch``. A capture calls ``at(j, rows)`` before each
    projection and ``end(rows)`` after the last; raises RuntimeError when ``end`` finds the projections
    not visited in order (a read forked and never joined would leave the capture unjoined).
    """

    def __init__(self, weights: list[torch.Tensor], max_rows: int, distance: int = 1, reader=None):
        if distance < 1:
            raise ValueError(f"distance must be >= 1 (got {distance})")
        self.weights, self.max_rows, self.distance = list(weights), max_rows, distance
        self._reader = reader
        self._sink = None
        self._side = None
        self._ready: dict[int, torch.cuda.Event] = {}

    def warm(self) -> None:
        """Makes the side stream and compiles and loads the read kernel outside any capture (call once before
        capturing graphs): a first launch inside a capture would load a module there. Every weight shares the
        one specialization (sizes multiples of 16, 16-byte aligned)."""
        if self.weights:
            self._streams(self.weights[0].device)
            if self._reader is None:
                touch(self.weights[0], self._sink)

    def _streams(self, device: torch.device) -> None:
        """The side stream and the read kernel's sink, made once (outside a capture when ``warm`` ran)."""
        if self._side is None:
            self._side = torch.cuda.Stream(device=device)
            self._sink = torch.zeros(1, dtype=torch.int32, device=device)

    def active(self, rows: int) -> bool:
        """True when a step of ``rows`` rows being captured now reads ahead."""
        return rows <= self.max_rows and torch.cuda.is_current_stream_capturing()

    def _fetch(self, j: int) -> None:
        if j >= len(self.weights) or j in self._ready:
            return
        main = torch.cuda.current_stream()
        self._streams(main.device)
        self._side.wait_stream(main)  # the side's read overlaps what the main stream runs from here on
        with torch.cuda.stream(self._side):
            (self._reader or (lambda w: touch(w, self._sink)))(self.weights[j])
            ev = torch.cuda.Event()
            ev.record(self._side)
        self._ready[j] = ev

    def at(self, j: int, rows: int) -> None:
        """Before projection ``j`` of a step of ``rows`` rows is enqueued: the read of its weights joined (when one
        was forked), the reads of projections j + 1 .. j + distance forked (those not forked yet)."""
        if not self.active(rows):
            return
        if j in self._ready:
            torch.cuda.current_stream().wait_event(self._ready.pop(j))
        for ahead in range(j + 1, j + 1 + self.distance):
            self._fetch(ahead)

    def end(self, rows: int) -> None:
        """After the step's last projection: the side stream joined into the capture stream."""
        if not self.active(rows):
            return
        if self._side is not None:  # joined first, so a capture that raises below still ends joined
            torch.cuda.current_stream().wait_stream(self._side)
        if self._ready:
            left = sorted(self._ready)
            self._ready.clear()
            raise RuntimeError(f"projections {left} were read ahead and never run: the step skipped them")
