"""CUDA-graph replay of decode steps (flashinfer backend, CUDA only).

Eager decode of a small batch is bound by Python and kernel-launch overhead (about 14 ms per step for the
starcoderbase-1b shape on the H200 against 0.6 ms of memory traffic). This captures, per batch-size bucket
(1, 2, 4, ..., max), one graph of ``model.forward + model.raw_logits`` (the logits in the model's dtype) and the
greedy pick of every row (``model/greedy.GreedyArgmax``) over static buffers. A decode batch
of b requests runs in the smallest bucket B >= b; the B - b padding rows read and write only the reserved
slot 0 (token 0 at position 0, K/V length 1), which is what slot 0 is for.

flashinfer's ``plan`` is not capturable: it runs before each replay and writes the batch's indptr and
slot indices into the buffers the graph reads (``use_cuda_graph=True`` wrappers). Every host array goes to
the device from pinned memory, so preparing a step never waits for the GPU; each plan goes through one of
a ring of page-locked buffers in turn (``attention.plan_ring``, ``PLAN_DEPTH`` to start with, growing while the
host is further ahead), so the host plans and enqueues a whole multi-step Forward, and the next one launched behind
it, without waiting for the device. Buckets of up to
``triton_max_batch`` rows take the Triton multi-query kernel (``attention/triton_decode.py``) instead: it reads
the buffers itself, and a step only copies its indptr and slots into them (no plan, no wait).
"""

from __future__ import annotations

import numpy as np
import torch

from worker_svc.attention.base import AttentionBackend, AttentionMeta
from worker_svc.attention.flashinfer_backend import FlashInferAttention
from worker_svc.attention.plan_ring import PlanRing
from worker_svc.attention.triton_decode import TritonDecodeAttention
from worker_svc.forward_batch import BatchLayout, build_layout
from worker_svc.kv_pool import KVPool
from worker_svc.model.config import ModelConfig
from worker_svc.model.gpt_bigcode import GPTBigCodeForCausalLM
from worker_svc.model.greedy import GreedyArgmax
from worker_svc.step_feed import StepFeed, pinned, to_device


# page-locked plan buffers of the flashinfer buckets to start with: when a Forward is launched behind the one ahead,
# only that one's last plan may still be in flight, so its 8 steps (K = 8) and that plan fit without growing the ring
# (``attention.plan_ring``; 8 MiB each, flashinfer's int workspace: 72 MiB of pinned host memory)
PLAN_DEPTH = 9


def index_capacity(max_batch: int, n_positions: int) -> int:
    """Entries of the graphs' shared ``kv_indices`` buffer (int32): the most KV slots one decode batch can list.

    Every row lists its whole slot table (prefix + new token), at most ``n_positions`` entries (the worker
    rejects positions >= n_positions), so a batch of ``max_batch`` rows lists at most ``max_batch * n_positions``.
    Not the pool's size: with the radix cache, rows share their prefix slots, and the sum of the rows' tables
    exceeds the pool when many requests read one long prefix (seen on the H200, bench/results/h200-run6: 64
    requests of one 3,200-token tenant prefix over a 76,800-slot pool; flashinfer's plan refused the batch). For
    the 15B shape at 256 rows: 256 x 8,192 x 4 B = 8 MiB."""
    return max_batch * n_positions


def buckets(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to and including ``max_batch`` (which need not be a power of two)."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return out + [max_batch]


def pad_layout(layout: BatchLayout, size: int) -> BatchLayout:
    """A decode layout padded to ``size`` requests with rows at position 0 reading/writing slot 0 only."""
    extra = size - layout.batch_size
    if extra < 0 or not layout.is_decode:
        raise ValueError(f"cannot pad a batch of {layout.batch_size} (decode={layout.is_decode}) to {size}")
    zeros = np.zeros(extra, dtype=np.int64)
    return BatchLayout(
        positions=np.concatenate([layout.positions, zeros]),
        out_slots=np.concatenate([layout.out_slots, zeros]),
        qo_indptr=np.arange(size + 1, dtype=np.int32),
        kv_indptr=np.concatenate([layout.kv_indptr, layout.kv_indptr[-1] + np.arange(1, extra + 1, dtype=np.int32)]),
        kv_indices=np.concatenate([layout.kv_indices, zeros.astype(np.int32)]),
        last_rows=np.arange(size, dtype=np.int64),
        qo_lens=(1,) * size,
        kv_lens=layout.kv_lens + (1,) * extra,
        is_decode=True,
    )


class DecodeGraphs:
    """Captured decode graphs, one per bucket. ``run(layout, input_ids)`` -> float32 logits [b, vocab];
    ``run_step(feed, j, input_ids)`` -> (logits [b, vocab] in the model's dtype, greedy ids int64 [b])."""

    def __init__(self, cfg: ModelConfig, model: GPTBigCodeForCausalLM, kv_pool: KVPool, sm_scale: float,
                 workspace: torch.Tensor, max_batch: int = 256, triton_max_batch: int = 0):
        """``workspace``: flashinfer's float workspace shared with the eager backend, sized for ``max_batch``
        (``attention.workspace.workspace_bytes``). Buckets of up to ``triton_max_batch`` rows take the Triton
        multi-query kernel (``attention/triton_decode.py``; multi-query models only, RuntimeError otherwise), the
        others flashinfer's tensor-core decode wrappers, planned before each replay. ValueError for a negative
        ``triton_max_batch``."""
        if triton_max_batch < 0:
            raise ValueError(f"triton_max_batch must be >= 0 (got {triton_max_batch})")
        dev, dtype = kv_pool.device, kv_pool.dtype
        self.cfg, self.model, self.kv_pool = cfg, model, kv_pool
        self.max_batch = max_batch
        self.sizes = buckets(max_batch)
        self.ids = torch.zeros(max_batch, dtype=torch.long, device=dev)
        self.positions = torch.zeros(max_batch, dtype=torch.long, device=dev)
        self.out_slots = torch.zeros(max_batch, dtype=torch.long, device=dev)
        # shared by every bucket's wrapper (only one graph runs at a time)
        self.kv_indptr = torch.zeros(max_batch + 1, dtype=torch.int32, device=dev)
        self.kv_indices = torch.zeros(index_capacity(max_batch, cfg.n_positions), dtype=torch.int32, device=dev)
        self.kv_last = torch.ones(max_batch, dtype=torch.int32, device=dev)
        self.greedy = GreedyArgmax(max_batch, cfg.vocab_size, dev)
        mempool = torch.cuda.graph_pool_handle()
        self.triton_max_batch = min(triton_max_batch, max_batch)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, AttentionBackend, torch.Tensor]] = {}
        for size in reversed(self.sizes):  # largest first: smaller graphs reuse its memory
            if size <= triton_max_batch:
                backend = TritonDecodeAttention(cfg.n_head, cfg.kv_heads, cfg.head_dim, sm_scale, dtype,
                                                self.kv_indptr[: size + 1], self.kv_indices, size,
                                                pdl=model.pdl, write_kv=model.fuse_kv)
            else:
                backend = FlashInferAttention(cfg.n_head, cfg.kv_heads, cfg.head_dim, sm_scale, dtype, dev, workspace,
                                              graph_buffers=(self.kv_indptr[: size + 1], self.kv_indices,
                                                             self.kv_last[:size]))
            layout = pad_layout(build_layout([], [], []), size)
            backend.plan(AttentionMeta.from_layout(layout, dev))
            args = (self.ids[:size], self.positions[:size], kv_pool, backend, self.out_slots[:size])
            stream = torch.cuda.Stream(dev)
            stream.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm up outside the graph (allocator, lazy init, the Triton compile)
                    self.greedy.pick(model.raw_logits(model(*args)))
            torch.cuda.current_stream(dev).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=mempool):
                logits = model.raw_logits(model(*args))  # [size, vocab] in the model's dtype
                self.greedy.pick(logits)  # into self.greedy.out[:size]
            self.graphs[size] = (graph, backend, logits)
        torch.cuda.synchronize(dev)
        # the flashinfer buckets' page-locked plan buffers (one ring for all: one graph runs at a time)
        flashinfer_backends = [b for _, b, _ in self.graphs.values() if isinstance(b, FlashInferAttention)]
        self.plans = (PlanRing(PLAN_DEPTH, max(b.int_workspace_bytes() for b in flashinfer_backends))
                      if flashinfer_backends else None)

    def fits(self, layout: BatchLayout) -> bool:
        return layout.is_decode and layout.batch_size <= self.max_batch

    def bucket(self, rows: int) -> int:
        """The smallest captured batch size >= ``rows``. Raises ValueError above ``max_batch``."""
        if rows > self.max_batch:
            raise ValueError(f"{rows} rows exceed the largest captured decode batch {self.max_batch}")
        return next(s for s in self.sizes if s >= rows)

    def run(self, layout: BatchLayout, input_ids: torch.Tensor) -> torch.Tensor:
        """Replays the bucket for a decode ``layout``; ``input_ids`` int64 [b] on the device.

        Returns a view of the graph's logits [b, vocab] float32 (valid until the next replay)."""
        b = layout.batch_size
        size = self.bucket(b)
        padded = pad_layout(layout, size) if size != b else layout
        dev = self.ids.device
        return self._replay(size, b, input_ids, pinned(padded.kv_indptr.astype(np.int32), dev),
                            to_device(padded.kv_indices.astype(np.int32), dev), to_device(padded.positions, dev),
                            to_device(padded.out_slots, dev), pinned(np.ones(size, dtype=np.int32), dev)).float()

    def run_step(self, feed: StepFeed, j: int, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Replays step j of a multi-step Forward for its active rows (``input_ids`` int64 [n] on the
        device); ``feed`` was padded to this object's buckets (``StepFeed(..., bucket=self.bucket)``). Returns views
        of the logits [n, vocab] in the model's dtype (``.float()`` is exact) and of each row's greedy token, int64
        [n] (``logits.float().argmax(-1)``), both valid until the next replay."""
        n = feed.active(j)
        return self._replay(feed.size[j], n, input_ids, *feed.step(j)), self.greedy.out[:n]

    def _replay(self, size: int, b: int, input_ids: torch.Tensor, kv_indptr_host: torch.Tensor,
                kv_indices: torch.Tensor, positions: torch.Tensor, out_slots: torch.Tensor,
                kv_last_host: torch.Tensor) -> torch.Tensor:
        graph, backend, logits = self.graphs[size]
        self.ids[:b].copy_(input_ids)
        self.ids[b:size].zero_()
        self.positions[:size].copy_(positions)
        self.out_slots[:size].copy_(out_slots)
        if isinstance(backend, TritonDecodeAttention):
            backend.load_step(kv_indptr_host, kv_indices)
            graph.replay()
            return logits[:b]
        backend.plan_decode(kv_indptr_host, kv_indices, kv_last_host, page_locked=self.plans.take())
        self.plans.planned()
        graph.replay()
        return logits[:b]
