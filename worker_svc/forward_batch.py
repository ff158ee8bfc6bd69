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
        if len(t) != p + n:
            raise ValueError(f"request {b}: slot table has {len(t)} entries, expected prefix {p} + new {n}")
    return layout_from_parts([np.asarray(t[:p], dtype=np.int32) for p, t in zip(prefix_lens, tables)],
                             [t[p:] for p, t in zip(prefix_lens, tables)])


def layout_from_parts(prefix_tables: Sequence[np.ndarray], new_slots: Sequence[Sequence[int]]) -> BatchLayout:
    """The layout from each request's cached slot table (int32 array, its prefix) and its new tokens' slots.

    Same result as ``build_layout``; avoids per-token Python work for long prefixes. Raises ValueError if a
    request has no new tokens.
    """
    prefix_lens = [len(t) for t in prefix_tables]
    new_lens = [len(s) for s in new_slots]
    if any(n < 1 for n in new_lens):
        raise ValueError(f"request {new_lens.index(min(new_lens))}: no new tokens")
    kv_lens = [p + n for p, n in zip(prefix_lens, new_lens)]
    qo_ptr = indptr(new_lens)
    out_slots = np.fromiter(itertools.chain.from_iterable(new_slots), dtype=np.int64, count=int(qo_ptr[-1]))
    out32 = out_slots.astype(np.int32)
    ptr = qo_ptr.tolist()
    parts: list[np.ndarray] = []
    for b, t in enumerate(prefix_tables):
        parts.append(t)
        parts.append(out32[ptr[b]:ptr[b + 1]])
    is_decode = all(n == 1 for n in new_lens)
    return BatchLayout(
        positions=np.asarray(prefix_lens, dtype=np.int64) if is_decode else positions(prefix_lens, new_lens),
        out_slots=out_slots,
        qo_indptr=qo_ptr,
        kv_indptr=indptr(kv_lens),
        kv_indices=np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32),
        last_rows=(qo_ptr[1:].astype(np.int64) - 1),
        qo_lens=tuple(new_lens),
        kv_lens=tuple(kv_lens),
        is_decode=is_decode,
    )


class DecodeSteps:
    """The layouts of the decode steps of one multi-step Forward on the eager path, built once per Forward.

    Rows are ordered by steps, largest first (``ks`` non-increasing), so step j runs rows ``[0, n_j)``.
    ``prefix_tables[b]``: int32 slots of row b's tokens with K/V before this Forward; ``new_slots[b]``: its
    ``ks[b]`` new slots, one per step. Step j of row b writes ``new_slots[b][j]`` at position
    ``len(prefix_tables[b]) + j`` and reads its prefix and its first j + 1 new slots: ``layout(j, n)`` equals
    ``layout_from_parts([full_b[: p_b + j] ...], [full_b[p_b + j : p_b + j + 1] ...])`` over the first n rows,
    with every row's full table concatenated once here instead of per step. Raises ValueError when a row
    has not one new slot per step.
    """

    def __init__(self, prefix_tables: Sequence[np.ndarray], new_slots: Sequence[Sequence[int]], ks: Sequence[int]):
        if len(new_slots) != len(ks) or any(len(s) != k for s, k in zip(new_slots, ks)):
            raise ValueError("each row needs one new slot per step")
        parts = [x for t, s in zip(prefix_tables, new_slots) for x in (t, np.asarray(s, dtype=np.int32))]
        self.flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)  # int32: row b's full table
        prefix_lens = [len(t) for t in prefix_tables]
        starts = [0] * len(ks)
        for b in range(1, len(ks)):
            starts[b] = starts[b - 1] + prefix_lens[b - 1] + ks[b - 1]
        self.starts = starts  # row b's table begins at flat[starts[b]]
        self.prefix_ends = [s + p for s, p in zip(starts, prefix_lens)]
        self.prefix_lens = np.asarray(prefix_lens, dtype=np.int64)

    def layout(self, j: int, n: int) -> BatchLayout:
        """The layout of step j for its n active rows (the first n)."""
        flat = self.flat
        kv_indices = np.concatenate([flat[s:e + j + 1] for s, e in zip(self.starts[:n], self.prefix_ends[:n])]) \
            if n else np.zeros(0, dtype=np.int32)
        positions = self.prefix_lens[:n] + j
        kv_lens = positions + 1
        out_slots = flat[np.asarray(self.prefix_ends[:n], dtype=np.int64) + j].astype(np.int64)
        return BatchLayout(
            positions=positions,
            out_slots=out_slots,
            qo_indptr=np.arange(n + 1, dtype=np.int32),
            kv_indptr=indptr(kv_lens),
            kv_indices=kv_indices,
            last_rows=np.arange(n, dtype=np.int64),
            qo_lens=(1,) * n,
            kv_lens=tuple(kv_lens.tolist()),
            is_decode=True,
        )
