"""Size of flashinfer's float workspace, derived from the worker's configuration (never a fixed constant).

flashinfer 0.6.4 keeps the split-KV temporaries of its FA2 paged prefill kernel in the float workspace that
a wrapper is built with. Our decode uses that kernel (``use_tensor_cores=True``), eager and in CUDA graphs,
so decode plans always go through ``PrefillPlan`` (``include/flashinfer/attention/scheduler.cuh``); extend
plans do too before sm90 (on sm90 the prefill wrapper's ``auto`` backend picks FA3, whose plan keeps no
float temporaries, so the eager term below is conservative there: 837 MB against ~709 MB needed for 15B
on the H200). ``PrefillPlan`` allocates, when it splits the KV:

    tmp_v = num_qo_heads * padded_batch_size * cta_tile_q * head_dim * 4 bytes   (float32)
    tmp_s = num_qo_heads * padded_batch_size * cta_tile_q * 4 bytes

each aligned to 16 bytes, where

- ``max_batch_size_if_split = 2 * num_sms // num_kv_heads`` (two CTAs per SM);
- eager (no CUDA graph): it splits only when the split batch fits, so ``padded_batch_size <=
  max_batch_size_if_split``; ``cta_tile_q`` (``FA2DetermineCtaTileQ``) is 16, 64 or 128 (64 or 128 below
  sm80);
- CUDA graph of B decode rows (one query each, G = num_qo_heads / num_kv_heads packed rows a request):
  ``cta_tile_q = cta_tile(G)`` and ``padded_batch_size = max(max_batch_size_if_split,
  ceil(B * G / cta_tile_q) + B - 1)``; it always splits.
- CUDA graph of one extend of up to T new tokens (``extend_whole_graph``: one request, its qo rows fixed at T
  by the capture's plan): ``cta_tile_q = cta_tile(T * G)`` and ``padded_batch_size =
  max(max_batch_size_if_split, ceil(T * G / cta_tile_q))``; it always splits too.

Measured on the H200 (132 SMs) on 2026-12-01 with the fixed 256 MiB this replaced: the starcoder shape (48
heads, head_dim 128) asked 703,070,208 bytes for tmp_v at graph batch 256, starcoderbase-7b (32 heads)
401,604,608; both equal the formula (tests/worker/test_workspace.py). The bound for eager batches is what
a 1B model (16 heads) can already reach: 279 MB, over the old constant. Which term decides depends on the
SM count: on the H200 the eager term for every shape of the family; on a GPU with fewer SMs the graph
term (starcoder on 58 SMs: 368 MB eager, 709 MB for graphs up to batch 256). flashinfer's int workspace
(8 MiB per wrapper, its own) holds the plans' index arrays: ~28 B x 4,096 x n_head at most (FA3), 5.5 MB
for 48 heads.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

FLOAT_BYTES = 4
ALIGN = 16
MAX_CTA_TILE_Q = 128


def cta_tile_q(packed_qo_len: int, head_dim: int, sm_major: int = 9) -> int:
    """flashinfer's ``FA2DetermineCtaTileQ``: query tile rows for an average packed query length on a GPU of
    compute capability ``sm_major``.x (below 8 the 16-row tile does not fit the shared memory: 64)."""
    if packed_qo_len > 64 and head_dim < 256:
        return 128
    if sm_major < 8:
        return 64
    return 64 if packed_qo_len > 16 else 16


def _split_bytes(n_head: int, head_dim: int, padded_batch: int, tile: int) -> int:
    """tmp_v + tmp_s with their alignment (bytes)."""
    v = n_head * padded_batch * tile * head_dim * FLOAT_BYTES
    s = n_head * padded_batch * tile * FLOAT_BYTES
    return v + ALIGN + s + ALIGN


def workspace_parts(n_head: int, kv_heads: int, head_dim: int, num_sms: int, graph_batches: Iterable[int] = (),
                    sm_major: int = 9, extend_tokens: Iterable[int] = ()) -> tuple[int, int]:
    """(eager bytes, CUDA-graph bytes): what eager extend / decode plans of any size need, and what CUDA-graph
    decode at the largest of ``graph_batches`` and the one-request extend graphs of ``extend_tokens`` tokens need
    (0 without graphs). See ``workspace_bytes``."""
    if n_head % kv_heads:
        raise ValueError(f"{n_head} query heads are not a multiple of {kv_heads} K/V heads")
    split_batch = max(1, 2 * num_sms // kv_heads)
    eager = _split_bytes(n_head, head_dim, split_batch, MAX_CTA_TILE_Q)
    group, graph = n_head // kv_heads, 0
    for b in graph_batches:
        tile = cta_tile_q(group, head_dim, sm_major)
        padded = max(split_batch, -(-b * group // tile) + b - 1)
        graph = max(graph, _split_bytes(n_head, head_dim, padded, tile))
    for t in extend_tokens:
        tile = cta_tile_q(t * group, head_dim, sm_major)
        padded = max(split_batch, -(-t * group // tile))
        graph = max(graph, _split_bytes(n_head, head_dim, padded, tile))
    return eager, graph


def workspace_bytes(n_head: int, kv_heads: int, head_dim: int, num_sms: int,
                    graph_batches: Iterable[int] = (), sm_major: int = 9, extend_tokens: Iterable[int] = ()) -> int:
    """Bytes of float workspace that every plan of this worker fits in: eager extend / decode batches of any
    size, CUDA-graph decode at each batch size in ``graph_batches``, and one-request extend graphs of each token
    bucket in ``extend_tokens`` (``extend_whole_graph``).

    ``n_head`` query heads, ``kv_heads`` K/V heads (1 for multi-query GPTBigCode), ``num_sms`` the device's
    multiprocessor count, ``sm_major`` its compute capability's major number. Raises ValueError for shapes
    flashinfer cannot run (heads not a multiple of kv_heads). The formula and where it comes from: this
    module's docstring.
    """
    return max(workspace_parts(n_head, kv_heads, head_dim, num_sms, graph_batches, sm_major, extend_tokens))


def allocate_workspace(n_head: int, kv_heads: int, head_dim: int, device: torch.device | str,
                       graph_batches: Iterable[int] = (), extend_tokens: Iterable[int] = ()) -> torch.Tensor:
    """The workspace (uint8 [workspace_bytes(...)] on ``device``), sized for ``device``'s SM count.

    Raises RuntimeError naming the size and the settings that drive it when the GPU cannot hold it."""
    device = torch.device(device)
    props = torch.cuda.get_device_properties(device)
    graph_batches, extend_tokens = tuple(graph_batches), tuple(extend_tokens)
    eager, graph = workspace_parts(n_head, kv_heads, head_dim, props.multi_processor_count, graph_batches,
                                   props.major, extend_tokens)
    nbytes = max(eager, graph)
    try:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    except torch.cuda.OutOfMemoryError as e:
        free = torch.cuda.mem_get_info(device)[0]
        if graph > eager:
            why = (f"CUDA graphs (decode up to batch {max(graph_batches, default=0)}, one-request extends up to "
                   f"{max(extend_tokens, default=0)} tokens) decide it (eager plans need {eager / 2**20:.0f} MiB): "
                   "lower --cuda-graph-max-batch or --extend-graph-max-tokens, leave --extend-whole-graph off, or "
                   "use a larger GPU")
        else:
            why = ("eager plans decide it (split-KV over 2 CTAs per SM: --cuda-graph-max-batch does not change "
                   "it): use a GPU with more free memory after the weights")
        raise RuntimeError(
            f"flashinfer needs a {nbytes / 2**20:.0f} MiB workspace ({n_head} query heads, head_dim {head_dim}, "
            f"{props.multi_processor_count} SMs) but only {free / 2**20:.0f} MiB of GPU memory is free after "
            f"the weights; {why}") from e
