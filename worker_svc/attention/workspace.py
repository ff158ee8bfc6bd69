"""Size of flashinfer's float workspace, derived from the worker's configuration (never a fixed constant).

flashinfer 0.6.4 keeps the split-KV temporaries of its paged prefill kernel in the float workspace that a
wrapper is built with. Our decode uses that kernel too (``use_tensor_cores=True``), so both extend and
decode plans go through ``PrefillPlan`` (``include/flashinfer/attention/scheduler.cuh``), which allocates,
when it splits the KV:

    tmp_v = num_qo_heads * padded_batch_size * cta_tile_q * head_dim * 4 bytes   (float32)
    tmp_s = num_qo_heads * padded_batch_size * cta_tile_q * 4 bytes

each aligned to 16 bytes, where

- ``max_batch_size_if_split = 2 * num_sms // num_kv_heads`` (two CTAs per SM);
- eager (no CUDA graph): it splits only when the split batch fits, so ``padded_batch_size <=
  max_batch_size_if_split``; ``cta_tile_q`` (``FA2DetermineCtaTileQ``) is 16, 64 or 128;
- CUDA graph of B decode rows (one query each, G = num_qo_heads / num_kv_heads packed rows a request):
  ``cta_tile_q = cta_tile(G)`` and ``padded_batch_size = max(max_batch_size_if_split,
  ceil(B * G / cta_tile_q) + B - 1)``; it always splits.

Measured on the H200 (132 SMs) on 2026-12-01 with the fixed 256 MiB this replaced: the starcoder shape (48
heads, head_dim 128) asked 703,070,208 bytes for tmp_v at graph batch 256, starcoderbase-7b (32 heads)
401,604,608; both equal the formula (tests/worker/test_workspace.py). The bound for eager batches is what
a 1B model (16 heads) can already reach: 279 MB, over the old constant.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

FLOAT_BYTES = 4
ALIGN = 16
MAX_CTA_TILE_Q = 128


def cta_tile_q(packed_qo_len: int, head_dim: int) -> int:
    """flashinfer's ``FA2DetermineCtaTileQ`` on sm80+: query tile rows for an average packed query length."""
    if packed_qo_len > 64 and head_dim < 256:
        return 128
    return 64 if packed_qo_len > 16 else 16


def _split_bytes(n_head: int, head_dim: int, padded_batch: int, tile: int) -> int:
    """tmp_v + tmp_s with their alignment (bytes)."""
    v = n_head * padded_batch * tile * head_dim * FLOAT_BYTES
    s = n_head * padded_batch * tile * FLOAT_BYTES
    return v + ALIGN + s + ALIGN


def workspace_bytes(n_head: int, kv_heads: int, head_dim: int, num_sms: int,
                    graph_batches: Iterable[int] = ()) -> int:
    """Bytes of float workspace that every plan of this worker fits in: eager extend / decode batches of any
    size, and CUDA-graph decode at each batch size in ``graph_batches``.

    ``n_head`` query heads, ``kv_heads`` K/V heads (1 for multi-query GPTBigCode), ``num_sms`` the device's
    multiprocessor count. Raises ValueError for shapes flashinfer cannot run (heads not a multiple of
    kv_heads). The formula and where it comes from: this module's docstring.
    """
    if n_head % kv_heads:
        raise ValueError(f"{n_head} query heads are not a multiple of {kv_heads} K/V heads")
    split_batch = max(1, 2 * num_sms // kv_heads)
    need = _split_bytes(n_head, head_dim, split_batch, MAX_CTA_TILE_Q)  # eager: any batch
    group = n_head // kv_heads
    for b in graph_batches:
        tile = cta_tile_q(group, head_dim)
        padded = max(split_batch, -(-b * group // tile) + b - 1)
        need = max(need, _split_bytes(n_head, head_dim, padded, tile))
    return need


def allocate_workspace(n_head: int, kv_heads: int, head_dim: int, device: torch.device | str,
                       graph_batches: Iterable[int] = ()) -> torch.Tensor:
    """The workspace (uint8 [workspace_bytes(...)] on ``device``), sized for ``device``'s SM count.

    Raises RuntimeError naming the size and the settings that drive it when the GPU cannot hold it."""
    device = torch.device(device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    graph_batches = tuple(graph_batches)
    nbytes = workspace_bytes(n_head, kv_heads, head_dim, sms, graph_batches)
    try:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    except torch.cuda.OutOfMemoryError as e:
        free = torch.cuda.mem_get_info(device)[0]
        raise RuntimeError(
            f"flashinfer needs a {nbytes / 2**20:.0f} MiB workspace ({n_head} query heads, head_dim {head_dim}, "
            f"{sms} SMs, largest CUDA-graph decode batch {max(graph_batches, default=0)}; "
            f"--cuda-graph-max-batch sets it) but only {free / 2**20:.0f} MiB of GPU memory is free after the "
            "weights: lower --cuda-graph-max-batch or use a larger GPU") from e
