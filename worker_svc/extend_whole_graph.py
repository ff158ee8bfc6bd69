"""One CUDA graph per token bucket for an extend of ONE request: the whole forward, flashinfer's paged prefill
attention inside it (CUDA only; the logic also runs uncaptured on any device, for tests).

The piecewise graphs (``extend_graph``) run attention eagerly between their ``n_layer + 1`` replays: for
tiny_starcoder_py's 20 layers, 20 eager attention calls and 21 launches, ~1 ms+ of host work per extend, and an
editor's completion is one extend per keystroke (one request, 16-200 new tokens over a cached ~1,700-token
prefix). flashinfer's prefill wrapper can be captured when the batch size is fixed (``use_cuda_graph=True`` with
static index buffers; ``plan`` runs before each replay and writes the real lengths there), and a batch of one
request always has batch size 1. So per token bucket T (``extend_graph.token_buckets``) one graph holds

    embed -> per layer: ln_1, c_attn, K/V write, attention, c_proj, ln_2, MLP -> ln_f -> hidden [T, n_embd]
    -> logits of the last real row [1, vocab] float32 (its row index read from a device buffer)

The graph runs T rows: the t <= T real ones first, then T - t padding rows of token 0 at position 0 that write
K/V only to the reserved slot 0 (as in ``extend_graph``). Attention is planned for the real request only
(qo_indptr [0, t], kv_indptr [0, p + t]: its p cached slots, then its t new ones). flashinfer sizes the captured
grid from the first plan's query rows (the capture's: T) and later plans may have fewer (flashinfer 0.6.4, FA2:
``PrefillSplitQOKVIndptr`` bounds the tiles by those rows and always splits the KV in graph mode; FA3 on sm90:
a fixed grid of one CTA per SM working through the list the plan writes). Padding rows are never attended;
their rows of the attention output keep earlier finite values, and rows of a GEMM or LayerNorm do not mix.

Memory: static buffers of ``max_tokens`` rows (ids / positions / slots in one int64 feed, the attention output,
the hidden states); the graphs share one memory pool, captured largest first (each releases its working set at
the end of its capture: the pool holds about the largest bucket's); one flashinfer wrapper per bucket, each with
flashinfer's own int workspace (8 MiB on the device, 8 MiB pinned); the float workspace is the worker's, sized
for these buckets (``attention.workspace``, ``extend_tokens``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from worker_svc.attention.base import AttentionBackend, AttentionMeta
from worker_svc.attention.flashinfer_backend import PREFILL_BACKENDS
from worker_svc.extend_graph import token_buckets
from worker_svc.forward_batch import BatchLayout
from worker_svc.kv_pool import KVPool
from worker_svc.model.gpt_bigcode import GPTBigCodeForCausalLM
from worker_svc.step_feed import pinned, to_device


FA2_MAX_TOKENS = 128  # auto: buckets up to this many tokens run flashinfer's fa2 paged prefill (prefill_backend_for)


def prefill_backend_for(size: int, choice: str) -> str:
    """flashinfer's paged prefill implementation in the whole extend graph of ``size`` tokens: ``choice`` when it
    names one (``fa2``, ``fa3``); ``auto``: ``fa2`` up to ``FA2_MAX_TOKENS`` tokens, flashinfer's own choice above
    (FA3 on sm90, FA2 below). Why (H200 run 14, one request over a cached 1,700-token prefix): FA3 runs one CTA per
    128-row query tile of each K/V head and GPTBigCode has one K/V head, so a short extend is a few CTAs walking
    the whole prefix; FA2 splits the KV over the GPU in graph mode. The whole graph's GPU time, tiny_starcoder_py
    (``worker_svc.bench --prefill-prefix 1700``): 16 tokens 1.08 -> 0.72 ms, 128 tokens 1.28 -> 1.00 ms, 512
    tokens 1.46 -> 1.64 ms (worse); the attention alone (``bench.extend_attn_bench``), starcoderbase-1b: 16 tokens
    28.4 -> 10.9 us a layer, 128 tokens 31.4 -> 19.6, 512 tokens 37.1 -> 55.9 (worse). Raises ValueError for an
    unknown ``choice``."""
    if choice not in PREFILL_BACKENDS:
        names = f"{', '.join(PREFILL_BACKENDS[:-1])} or {PREFILL_BACKENDS[-1]}"
        raise ValueError(f"the whole extend graphs' prefill backend must be {names}, got {choice!r}")
    if choice != "auto":
        return choice
    return "fa2" if size <= FA2_MAX_TOKENS else "auto"


class WholeExtendGraphs:
    """``run(layout, input_ids)`` -> (hidden after ln_f [t, n_embd] (model dtype), logits of row t - 1 [1, vocab]
    float32) for a one-request layout of t <= ``max_tokens`` new tokens: views of static buffers, valid until the
    next run.

    ``capture=True`` (CUDA, flashinfer): one graph-mode ``FlashInferAttention`` per bucket on ``workspace``
    (flashinfer's float workspace, sized with ``extend_tokens=token_buckets(max_tokens)``), softmax scale
    ``sm_scale``. ``capture=False`` runs the same forward over the same buffers and padding without graphs, with
    ``backend`` (any attention backend, planned here for each run's real layout): what CPU tests check against
    the model's forward. ``prefill_backend``: flashinfer's paged prefill implementation in the captured graphs,
    per bucket (``prefill_backend_for``). Raises ValueError for ``capture=False`` without a backend or for an
    unknown ``prefill_backend``."""

    def __init__(self, model: GPTBigCodeForCausalLM, kv_pool: KVPool, max_tokens: int, *, capture: bool = True,
                 sm_scale: float | None = None, workspace: torch.Tensor | None = None,
                 backend: AttentionBackend | None = None, prefill_backend: str = "auto"):
        prefill_backend_for(1, prefill_backend)  # an unknown choice fails before anything is allocated
        cfg, dev, dtype = model.cfg, kv_pool.device, kv_pool.dtype
        self.model, self.kv_pool, self.max_tokens, self.capture = model, kv_pool, max_tokens, capture
        self.sizes = token_buckets(max_tokens)
        # bucket T reads ids feed[:T], positions feed[T:2T], out slots feed[2T:3T], last row feed[3T]
        self.feed = torch.zeros(3 * max_tokens + 1, dtype=torch.long, device=dev)
        self.o = torch.zeros(max_tokens, cfg.n_head, cfg.head_dim, dtype=dtype, device=dev)
        self.hidden = torch.zeros(max_tokens, cfg.n_embd, dtype=dtype, device=dev)
        self.backends: dict[int, AttentionBackend] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}  # [1, vocab] float32, each graph's output
        self._planned: torch.cuda.Event | None = None
        if capture:
            self._capture(sm_scale, workspace, prefill_backend)
        elif backend is None:
            raise ValueError("uncaptured whole extend graphs need an attention backend")
        else:
            self.backends = dict.fromkeys(self.sizes, backend)

    def fits(self, layout: BatchLayout) -> bool:
        """True for a batch of exactly one request with at most ``max_tokens`` new tokens."""
        return layout.batch_size == 1 and layout.num_tokens <= self.max_tokens

    def bucket(self, tokens: int) -> int:
        """The smallest bucket >= ``tokens``. Raises ValueError above ``max_tokens``."""
        if tokens > self.max_tokens:
            raise ValueError(f"{tokens} tokens exceed the largest whole extend graph ({self.max_tokens})")
        return next(s for s in self.sizes if s >= tokens)

    def _forward(self, size: int) -> torch.Tensor:
        """The forward of ``size`` rows over the static buffers (what is captured); attention through the
        bucket's backend, planned before. Returns the logits of row ``feed[3 size]`` [1, vocab] float32."""
        m, pool, f, backend = self.model, self.kv_pool, self.feed, self.backends[size]
        slots, o = f[2 * size:3 * size], self.o[:size]
        h, x, _ = m.piece(0, pool, slots, input_ids=f[:size], positions=f[size:2 * size])
        for i in range(m.cfg.n_layer):
            backend.attend(i, x, pool, out=o)  # paged: reads the pool (its K/V written by the piece)
            h, x, _ = m.piece(i + 1, pool, slots, h=h, o=o)
        self.hidden[:size].copy_(x)
        return m.logits(self.hidden.index_select(0, f[3 * size:3 * size + 1]))

    def _plan(self, size: int, rows: int, kv_indices: np.ndarray) -> None:
        """Plans the bucket's backend for one request of ``rows`` query rows over the slots ``kv_indices`` (int32:
        its cached ones, then its new ones). Graphs: waits first for the previous plan's copy out of flashinfer's
        page-locked buffer (``FlashInferAttention.plan_prefill``), then plans; uncaptured: ``plan`` of the same
        lengths."""
        dev = self.feed.device
        ptr = np.array([0, rows, 0, len(kv_indices)], dtype=np.int32)
        if not self.capture:
            self.backends[size].plan(AttentionMeta(
                qo_indptr=torch.from_numpy(ptr[:2]).to(dev), kv_indptr=torch.from_numpy(ptr[2:]).to(dev),
                kv_indices=torch.from_numpy(kv_indices).to(dev),
                kv_last_page_len=torch.ones(1, dtype=torch.int32, device=dev),
                qo_indptr_cpu=torch.from_numpy(ptr[:2]), kv_indptr_cpu=torch.from_numpy(ptr[2:]),
                qo_lens=(rows,), kv_lens=(len(kv_indices),), is_decode=rows == 1))
            return
        if self._planned is not None:
            self._planned.synchronize()
        host = pinned(ptr, dev)
        self.backends[size].plan_prefill(host[:2], host[2:], to_device(kv_indices, dev), self._ones)
        self._planned = torch.cuda.Event()
        self._planned.record()

    def _capture(self, sm_scale: float, workspace: torch.Tensor, prefill_backend: str) -> None:
        from worker_svc.attention.flashinfer_backend import FlashInferAttention

        cfg, dev = self.model.cfg, self.feed.device
        i32 = dict(dtype=torch.int32, device=dev)
        # shared by every bucket's wrapper (one graph runs at a time); one request lists <= n_positions slots
        buffers = (torch.zeros(2, **i32), torch.zeros(2, **i32), torch.zeros(cfg.n_positions, **i32),
                   torch.ones(1, **i32))
        self._ones = pinned(np.ones(1, dtype=np.int32), dev)
        mempool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):  # largest first: smaller graphs reuse its memory
            self.backends[size] = FlashInferAttention(cfg.n_head, cfg.kv_heads, cfg.head_dim, sm_scale,
                                                      self.kv_pool.dtype, dev, workspace, prefill_graph_buffers=buffers,
                                                      prefill_backend=prefill_backend_for(size, prefill_backend))
            self._plan(size, size, np.zeros(size, dtype=np.int32))  # the first plan fixes T query rows
            stream = torch.cuda.Stream(dev)
            stream.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm up outside the graph (allocator, Triton, cuBLAS handles)
                    self._forward(size)
            torch.cuda.current_stream(dev).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=mempool):
                self.logits[size] = self._forward(size)
            self.graphs[size] = graph
        torch.cuda.synchronize(dev)

    def run(self, layout: BatchLayout, input_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward of a one-request ``layout`` of t <= ``max_tokens`` new tokens, ``input_ids`` their t token
        ids (host ints). Writes the t tokens' K/V like the model's forward; returns (hidden [t, n_embd], logits of
        row t - 1 [1, vocab] float32), views valid until the next run. Raises ValueError when it does not fit."""
        if not self.fits(layout):
            raise ValueError(f"a whole extend graph runs one request of <= {self.max_tokens} tokens, got "
                             f"{layout.batch_size} requests of {layout.num_tokens}")
        t = layout.num_tokens
        size = self.bucket(t)
        feed = np.zeros(3 * size + 1, dtype=np.int64)  # padding rows: token 0, position 0, slot 0
        feed[:t], feed[size:size + t], feed[2 * size:2 * size + t] = input_ids, layout.positions, layout.out_slots
        feed[3 * size] = t - 1
        dev = self.feed.device
        self.feed[:3 * size + 1].copy_(pinned(feed, dev), non_blocking=True)
        self._plan(size, t, layout.kv_indices)
        if not self.capture:
            return self.hidden[:t], self._forward(size)
        self.graphs[size].replay()
        return self.hidden[:t], self.logits[size]
