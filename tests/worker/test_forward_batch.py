"""Flat batch layout: positions, slot mapping, indptr (pure functions)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker_svc.forward_batch import build_layout, indptr, positions


def test_mixed_extend_and_decode_layout():
    lay = build_layout([0, 3, 5], [2, 1, 3], [[7, 8], [1, 2, 3, 9], [4, 5, 6, 10, 11, 12, 13, 14]])
    assert lay.positions.tolist() == [0, 1, 3, 5, 6, 7]
    assert lay.out_slots.tolist() == [7, 8, 9, 12, 13, 14]
    assert lay.qo_indptr.tolist() == [0, 2, 3, 6]
    assert lay.kv_indptr.tolist() == [0, 2, 6, 14]
    assert lay.kv_indices.tolist() == [7, 8, 1, 2, 3, 9, 4, 5, 6, 10, 11, 12, 13, 14]
    assert lay.last_rows.tolist() == [1, 2, 5]
    assert not lay.is_decode and lay.num_tokens == 6 and lay.batch_size == 3


def test_decode_only_batch():
    lay = build_layout([4, 1], [1, 1], [[1, 2, 3, 4, 5], [6, 7]])
    assert lay.is_decode and lay.positions.tolist() == [4, 1] and lay.out_slots.tolist() == [5, 7]
    assert lay.last_rows.tolist() == [0, 1]


def test_bad_layouts_raise():
    with pytest.raises(ValueError, match="slot table has 2 entries, expected prefix 2 \\+ new 1"):
        build_layout([2], [1], [[1, 2]])
    with pytest.raises(ValueError, match="no new tokens"):
        build_layout([0], [0], [[]])


def test_helpers():
    assert indptr([]).tolist() == [0]
    assert indptr([3, 0, 2]).tolist() == [0, 3, 3, 5]
    assert positions([], []).tolist() == []


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 6)), min_size=1, max_size=8))
def test_layout_invariants(reqs):
    next_slot = iter(range(1, 10_000))
    tables = [[next(next_slot) for _ in range(p + n)] for p, n in reqs]
    lay = build_layout([p for p, _ in reqs], [n for _, n in reqs], tables)
    for b, (p, n) in enumerate(reqs):
        rows = slice(lay.qo_indptr[b], lay.qo_indptr[b + 1])
        assert lay.positions[rows].tolist() == list(range(p, p + n))
        assert lay.out_slots[rows].tolist() == tables[b][p:]
        assert lay.kv_indices[lay.kv_indptr[b]:lay.kv_indptr[b + 1]].tolist() == tables[b]
        assert lay.last_rows[b] == lay.qo_indptr[b + 1] - 1
    assert lay.kv_indices.dtype == np.int32 and lay.positions.dtype == np.int64


def test_cuda_graph_padding_uses_reserved_slot_only():
    from worker_svc.cuda_graph import buckets, pad_layout

    assert buckets(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256] and buckets(48)[-2:] == [32, 48] and buckets(1) == [1]
    lay = pad_layout(build_layout([2, 0], [1, 1], [[5, 6, 7], [9]]), 4)
    assert lay.positions.tolist() == [2, 0, 0, 0] and lay.out_slots.tolist() == [7, 9, 0, 0]
    assert lay.kv_indptr.tolist() == [0, 3, 4, 5, 6] and lay.kv_indices.tolist() == [5, 6, 7, 9, 0, 0]
    assert lay.is_decode and lay.batch_size == 4
    with pytest.raises(ValueError):
        pad_layout(build_layout([0], [2], [[1, 2]]), 4)  # not a decode batch
