"""The decode graphs' greedy pick (``worker_svc/model/greedy.py``) in Triton's interpreter (``TRITON_INTERPRET=1``,
CPU): the indices of ``torch.argmax(x.float(), -1)`` for float32, float16 and bfloat16 logits, a vocabulary that is
not a multiple of the chunk, ties inside one chunk and across chunks (the first wins), NaN (the first NaN wins, as
torch's argmax), rows of -inf only, fewer rows than the buffers hold; a shape that does not fit is refused."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from worker_svc.model import greedy
from worker_svc.model.greedy import BLOCK, GreedyArgmax

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="needs Triton importable (pip install triton; the interpreter runs on CPU)")


@pytest.fixture
def interpreted(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    greedy._kernels.cache_clear()
    yield
    greedy._kernels.cache_clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_pick_is_torchs_argmax_on_every_kind_of_row(interpreted, dtype):
    vocab = 2 * BLOCK + 123
    g = torch.Generator().manual_seed(0)
    x = torch.randn((9, vocab), generator=g).to(dtype)
    x[1, 7] = x[1, 4000] = x[1, BLOCK + 5] = 50.0  # equal maxima in one chunk and across chunks: index 7
    x[2, BLOCK + 3] = x[2, 2 * BLOCK + 100] = 60.0  # across chunks, none in the first: BLOCK + 3
    x[3, 2 * BLOCK + 122] = 70.0  # the very last entry, in the partial chunk
    x[4, 2 * BLOCK + 50] = float("nan")
    x[4, 3] = float("nan")  # NaN counts as the maximum: the first NaN
    x[4, 10] = float("inf")
    x[5] = float("-inf")  # nothing above -inf: index 0
    x[6, 5] = float("inf")
    x[6, BLOCK] = float("inf")
    x[7, BLOCK + 1] = float("nan")  # a NaN in the second chunk beats a +inf in the first
    x[7, 0] = float("inf")
    pick = GreedyArgmax(12, vocab, "cpu")
    got = pick.pick(x)
    want = torch.argmax(x.float(), dim=-1)
    assert got.dtype == torch.int64 and got.tolist() == want.tolist()
    assert got.tolist()[:8] == [want[0].item(), 7, BLOCK + 3, 2 * BLOCK + 122, 3, 0, 5, BLOCK + 1]
    assert pick.pick(x[:2]).tolist() == want[:2].tolist()  # fewer rows: the same buffers


def test_a_view_with_a_row_stride_is_read_as_it_is(interpreted):
    base = torch.randn((4, 300))
    x = base[:, :200]  # rows 300 apart
    assert GreedyArgmax(4, 200, "cpu").pick(x).tolist() == x.argmax(-1).tolist()


def test_a_shape_that_does_not_fit_is_refused():
    pick = GreedyArgmax(2, 100, "cpu")
    for bad in (torch.zeros(3, 100), torch.zeros(2, 99), torch.zeros(100, 2).T, torch.zeros(2, 100, dtype=torch.long)):
        with pytest.raises(ValueError):
            pick.pick(bad)
