"""Piecewise CUDA graphs for small extends: every piece of the forward between two attention calls replayed
from a graph, attention run eagerly between them (CUDA only; the logic also runs uncaptured, for tests).

An eager extend of a few dozen tokens is bound by the host: about 140 kernel launches and twice as many torch
ops for tiny_starcoder_py, ~0.7 ms of GPU work behind several ms of Python (bench/results/h200-run6,
ops-tiny-prefill96.txt), and an editor's completion is one such extend per keystroke. Attention cannot be
captured once for every batch (flashinfer's prefill ``plan`` depends on each request's lengths), but the
pieces around it (``GPTBigCodeForCausalLM.piece``: LayerNorms, GEMMs, GELU, K/V write) only depend on the
number of tokens. So per token bucket T (16, 24, 32, 48, ... up to ``max_tokens``: powers of two and 1.5x
between, so padding costs at most 50% of the GEMM work) the ``n_layer + 1`` pieces are captured; a batch of
t <= T tokens replays them over static buffers, and the backend, planned for the real batch, attends the
first t rows between pieces:

    piece 0 (embed, ln_1, c_attn, K/V write) -> q;  attend(0, q[:t]) -> o;  piece 1 (o -> layer 0 done, layer
    1 started) -> q;  ...;  piece n_layer -> hidden [T, n_embd];  the caller reads hidden[:t]

The T - t padding rows hold token 0 at position 0 and write their K/V only to the reserved slot 0 (as the
decode graphs' padding rows do); attention never reads them (it is planned for t tokens), so their rows of
the attention output keep earlier, finite values. Rows of a GEMM or a LayerNorm do not mix, so padding
changes no real row.

Memory: the query, attention output and final hidden states live in static buffers ([max_tokens, ...]); the
residual passes from piece to piece inside the graphs' shared memory pool, and each bucket's residuals are
released after the next piece is captured, so the pool holds about one bucket's working set, not one per
layer and bucket. That reuse is safe because each bucket's pieces replay in the order they were captured and
nothing outside the graphs reads pool memory.
"""

from __future__ import annotations

import numpy as np
import torch

from worker_svc.attention.base import AttentionBackend
from worker_svc.forward_batch import BatchLayout
from worker_svc.kv_pool import KVPool
from worker_svc.model.gpt_bigcode import GPTBigCodeForCausalLM
from worker_svc.step_feed import pinned


def token_buckets(max_tokens: int, smallest: int = 16) -> list[int]:
    """16, 24, 32, 48, 64, 96, ... (powers of two and 1.5x between) up to and including ``max_tokens``.
    Raises ValueError for ``max_tokens`` < 1."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    out, p = [], smallest
    while p < max_tokens:
        out += [p] + ([p * 3 // 2] if p * 3 // 2 < max_tokens else [])
        p *= 2
    return [s for s in out if s < max_tokens] + [max_tokens]


class ExtendGraphs:
    """The pieces of ``model``'s forward per token bucket; ``run(layout, input_ids, backend)`` -> hidden
    states [t, n_embd] (a view of a static buffer, valid until the next run).

    ``capture=False`` runs the same pieces over the same static buffers without graphs (any device): what
    the CPU tests check against the model's forward."""

    def __init__(self, model: GPTBigCodeForCausalLM, kv_pool: KVPool, max_tokens: int, capture: bool = True):
        cfg, dev, dtype = model.cfg, kv_pool.device, kv_pool.dtype
        self.model, self.kv_pool, self.max_tokens, self.capture = model, kv_pool, max_tokens, capture
        self.sizes = token_buckets(max_tokens)
        self.n_pieces = cfg.n_layer + 1
        self.ids = torch.zeros(max_tokens, dtype=torch.long, device=dev)
        self.positions = torch.zeros(max_tokens, dtype=torch.long, device=dev)
        self.out_slots = torch.zeros(max_tokens, dtype=torch.long, device=dev)
        self.q = torch.zeros(max_tokens, cfg.n_head, cfg.head_dim, dtype=dtype, device=dev)
        self.o = torch.zeros(max_tokens, cfg.n_head, cfg.head_dim, dtype=dtype, device=dev)
        self.hidden = torch.zeros(max_tokens, cfg.n_embd, dtype=dtype, device=dev)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        if capture:
            self._capture()

    def fits(self, layout: BatchLayout) -> bool:
        """True for a batch of at most ``max_tokens`` new tokens."""
        return layout.num_tokens <= self.max_tokens

    def bucket(self, tokens: int) -> int:
        """The smallest bucket >= ``tokens``. Raises ValueError above ``max_tokens``."""
        if tokens > self.max_tokens:
            raise ValueError(f"{tokens} tokens exceed the largest extend graph ({self.max_tokens})")
        return next(s for s in self.sizes if s >= tokens)

    def _piece(self, i: int, size: int, h: torch.Tensor | None) -> torch.Tensor:
        """Runs piece i for ``size`` rows (what is captured): its query goes to ``self.q``, the last piece's
        hidden states to ``self.hidden``. Returns the residual for piece i + 1."""
        m, n = self.model, slice(0, size)
        if i == 0:
            h, x, _ = m.piece(0, self.kv_pool, self.out_slots[n], input_ids=self.ids[n], positions=self.positions[n])
        else:
            h, x, _ = m.piece(i, self.kv_pool, self.out_slots[n], h=h, o=self.o[n])  # attention reads the pool
        (self.hidden if i == self.n_pieces - 1 else self.q)[n].copy_(x)
        return h

    def _capture(self) -> None:
        dev = self.ids.device
        mempool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(dev)
        for size in reversed(self.sizes):  # largest first
            stream.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(stream):  # warm up outside the graph (allocator, Triton, cuBLAS handles)
                h = None
                for i in range(self.n_pieces):
                    h = self._piece(i, size, h)
            torch.cuda.current_stream(dev).wait_stream(stream)
            graphs, h = [], None
            for i in range(self.n_pieces):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=mempool):
                    h = self._piece(i, size, h)  # the previous residual is released here, after its reader
                graphs.append(g)
            self.graphs[size] = graphs
            del h
        torch.cuda.synchronize(dev)

    def run(self, layout: BatchLayout, input_ids: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        """The forward of an extend (or mixed) ``layout`` of t <= ``max_tokens`` tokens; ``input_ids`` int64
        [t] on the device; ``backend`` planned for ``layout`` (``backend.plan``). Writes the t tokens' K/V like
        the model's forward and returns hidden states after ln_f [t, n_embd] (model dtype), a view valid
        until the next ``run``. Raises ValueError above ``max_tokens``."""
        t = layout.num_tokens
        size = self.bucket(t)
        pad = np.zeros(size - t, dtype=np.int64)  # padding rows: position 0, slot 0
        dev = self.ids.device
        self.ids[:t].copy_(input_ids)
        self.positions[:size].copy_(pinned(np.concatenate([layout.positions, pad]), dev), non_blocking=True)
        self.out_slots[:size].copy_(pinned(np.concatenate([layout.out_slots, pad]), dev), non_blocking=True)
        graphs, h = self.graphs.get(size), None
        for i in range(self.n_pieces):
            if graphs is not None:
                graphs[i].replay()
            else:
                h = self._piece(i, size, h)
            if i < self.n_pieces - 1:
                backend.attend(i, self.q[:t], self.kv_pool, out=self.o[:t])
        return self.hidden[:t]
