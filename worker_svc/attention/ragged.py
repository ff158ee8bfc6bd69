"""Which attention path an extend takes: flashinfer's ragged prefill (K/V of the new tokens read straight from the
``c_attn`` output) or the paged one (K/V gathered from the pool by slot). Pure host logic over a batch layout.

The ragged path sees only the new tokens' K/V, so it can serve a batch only when no request of it has a cached
prefix (``kv_len == qo_len`` for every request: the first chunk of a fresh prompt). It also needs the K/V tensors
of each layer as the eager forward hands them to ``attend`` (``new_kv``); the captured extend graphs
(``extend_graph``, ``extend_whole_graph``) keep the paged path, so only batches that run eagerly take it: those
above ``--extend-graph-max-tokens`` tokens, or every extend when the piecewise graphs are off.
"""

from __future__ import annotations

from worker_svc.forward_batch import BatchLayout


def no_cached_prefix(layout: BatchLayout) -> bool:
    """True when every request of ``layout`` attends to its new tokens alone (its prefix length is 0)."""
    return all(kv == qo for qo, kv in zip(layout.qo_lens, layout.kv_lens))


def takes_ragged(layout: BatchLayout, *, enabled: bool, eager: bool) -> bool:
    """True when ``layout``'s attention runs on the ragged path: ``enabled`` (the worker's ``--ragged-prefill`` and
    a backend that has the path), the batch runs ``eager`` (no captured graph takes it) and no request of it has a
    cached prefix."""
    return enabled and eager and no_cached_prefix(layout)
