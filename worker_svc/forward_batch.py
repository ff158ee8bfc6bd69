"""Flat batch layout for one forward pass: pure functions over integers, no device work.

A batch holds B requests; request b brings ``new_lens[b]`` new tokens whose absolute positions start at
``prefix_lens[b]`` (its tokens already in the KV pool). Tokens of all requests are concatenated
(request order), so row ``qo_indptr[b] + i`` is request b's i-th new token. ``tables[b]`` is request b's
slot table after this step: ``prefix_lens[b] + new_lens[b]`` slots, the new tokens' slots last.

The indptr arrays follow flashinfer's CSR convention (page size 1: one page per token):
``kv_indices[kv_indptr[b]:kv_indptr[b+1]] == tables[b]``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class BatchLayout:
    """Integer arrays (numpy int64/int32) describing one forward batch.

    positions   int64 [T]       absolute position of each new token
    out_slots   int64 [T]       slot each new token's K/V is written to
    qo_indptr   int32 [B+1]     new-token rows of each request
    kv_indptr   int32 [B+1]     slot-table ranges in kv_indices
    kv_indices  int32 [sum L]   concatenated slot tables (prefix + new), L_b = prefix_b + new_b
    last_rows   int64 [B]       row of each request's last new token (its logits give the next token)
    qo_lens, kv_lens            python ints per request
    is_decode   bool            every request has exactly one new token
    """

    positions: np.ndarray
    out_slots: np.ndarray
    qo_indptr: np.ndarray
    kv_indptr: np.ndarray
    kv_indices: np.ndarray
    last_rows: np.ndarray
    qo_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    is_decode: bool

    @property
    def num_tokens(self) -> int:
        return int(self.qo_indptr[-1])

    @property
    def batch_size(self) -> int:
        return len(self.qo_lens)


def positions(prefix_lens: Sequence[int], new_lens: Sequence[int]) -> np.ndarray:
    """Absolute positions of the new tokens, flat: request b contributes prefix_b .. prefix_b + new_b - 1."""
    if not new_lens:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(p, p + n, dtype=np.int64) for p, n in zip(prefix_lens, new_lens)])


def indptr(lengths: Sequence[int]) -> np.ndarray:
    """CSR offsets: [0, l0, l0+l1, ...] as int32 [len+1]."""
    out = np.zeros(len(lengths) + 1, dtype=np.int32)
    if len(lengths):
        out[1:] = np.cumsum(np.asarray(lengths, dtype=np.int64))
    return out


def build_layout(prefix_lens: Sequence[int], new_lens: Sequence[int], tables: Sequence[Sequence[int]]) -> BatchLayout:
    """The layout of a batch. Raises ValueError if a table's length is not prefix + new, or new is 0."""
    if not (len(prefix_lens) == len(new_lens) == len(tables)):
        raise ValueError("prefix_lens, new_lens and tables differ in length")
    for b, (p, n, t) in enumerate(zip(prefix_lens, new_lens, tables)):
        if n < 1:
            raise ValueError(f"request {b}: no new tokens")
        if len(t) != p + n:
            raise ValueError(f"request {b}: slot table has {len(t)} entries, expected prefix {p} + new {n}")
    kv_lens = [p + n for p, n in zip(prefix_lens, new_lens)]
    qo_ptr = indptr(new_lens)
    kv_ptr = indptr(kv_lens)
    total_kv = int(kv_ptr[-1])
    kv_indices = np.fromiter(itertools.chain.from_iterable(tables), dtype=np.int32, count=total_kv)
    new_slot_idx = np.concatenate([np.arange(kv_ptr[b] + p, kv_ptr[b + 1]) for b, p in enumerate(prefix_lens)]) \
        if tables else np.zeros(0, dtype=np.int64)
    out_slots = kv_indices[new_slot_idx].astype(np.int64)
    return BatchLayout(
        positions=positions(prefix_lens, new_lens),
        out_slots=out_slots,
        qo_indptr=qo_ptr,
        kv_indptr=kv_ptr,
        kv_indices=kv_indices,
        last_rows=(qo_ptr[1:].astype(np.int64) - 1),
        qo_lens=tuple(int(n) for n in new_lens),
        kv_lens=tuple(int(k) for k in kv_lens),
        is_decode=all(n == 1 for n in new_lens),
    )
