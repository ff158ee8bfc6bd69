"""StepFeed (device-side multi-step decode metadata) equals the host layout it replaces, step by step."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from worker_svc.cuda_graph import pad_layout
from worker_svc.forward_batch import layout_from_parts
from worker_svc.step_feed import StepFeed


def _host_step(tables, prefix_lens, ks, j, size):
    """What the host path (layout_from_parts + pad_layout) gives for step j padded to ``size`` rows."""
    n = sum(k > j for k in ks)
    layout = layout_from_parts([t[: p + j] for t, p in zip(tables[:n], prefix_lens[:n])],
                               [t[p + j: p + j + 1] for t, p in zip(tables[:n], prefix_lens[:n])])
    return pad_layout(layout, size)


@st.composite
def batches(draw):
    ks = sorted(draw(st.lists(st.integers(1, 5), min_size=1, max_size=6)), reverse=True)
    prefix_lens = [draw(st.integers(0, 9)) for _ in ks]
    slots = iter(draw(st.permutations(range(1, 1 + sum(p + k for p, k in zip(prefix_lens, ks))))))
    tables = [np.asarray([next(slots) for _ in range(p + k)], dtype=np.int32) for p, k in zip(prefix_lens, ks)]
    return tables, prefix_lens, ks


@settings(max_examples=60, deadline=None)
@given(batches(), st.integers(0, 3))
def test_every_step_matches_the_host_layout(batch, extra_rows):
    tables, prefix_lens, ks = batch
    feed = StepFeed([t[:p] for t, p in zip(tables, prefix_lens)], [tuple(t[p:]) for t, p in zip(tables, prefix_lens)], ks,
                    torch.device("cpu"), bucket=lambda n: n + extra_rows)
    for j in range(ks[0]):
        n = feed.active(j)
        size = n + extra_rows
        assert feed.size[j] == size
        indptr, indices, positions, out_slots, last = feed.step(j)
        want = _host_step(tables, prefix_lens, ks, j, size)
        assert n == sum(k > j for k in ks)
        assert indptr.tolist() == want.kv_indptr.tolist()
        assert indices.tolist() == want.kv_indices.tolist()
        assert positions.tolist() == want.positions.tolist()
        assert out_slots.tolist() == want.out_slots.tolist()
        assert last.tolist() == [1] * size
        assert indptr.dtype == torch.int32 and indices.dtype == torch.int32


def test_rejects_rows_without_one_new_slot_per_step():
    with pytest.raises(ValueError, match="one new slot per step"):
        StepFeed([np.asarray([1], dtype=np.int32)], [(2,)], [2], torch.device("cpu"))


def test_rejects_steps_not_sorted_largest_first():
    with pytest.raises(ValueError, match="non-increasing"):
        StepFeed([np.asarray([1], dtype=np.int32)] * 2, [(2,), (3, 4)], [1, 2], torch.device("cpu"))


def test_bucket_smaller_than_the_active_rows_is_an_error():
    with pytest.raises(ValueError, match="more than the bucket"):
        StepFeed([np.asarray([1], dtype=np.int32), np.asarray([3], dtype=np.int32)], [(2,), (4,)], [1, 1],
                 torch.device("cpu"), bucket=lambda n: 1)


def test_flashinfer_decode_max_shim_gives_the_builtin_value():
    """The ``max`` installed in flashinfer's decode module equals the builtin for the calls it sees."""
    from worker_svc.attention.flashinfer_backend import _tensor_aware_max

    lens = torch.tensor([5, 1152, 7], dtype=torch.int32)
    assert _tensor_aware_max(lens).item() == max(lens).item() == 1152
    assert _tensor_aware_max(3, 9, 4) == 9
    assert _tensor_aware_max([2, 8], default=0) == 8
