"""The flashinfer workspace is sized from the worker's configuration (pure arithmetic, runs on the CPU).

The figures asked by flashinfer 0.6.4 on the H200 (132 SMs) were read from its overflow errors on 2026-12-01
(issue 14), when the workspace was a fixed 256 MiB: the starcoder shape asked 703,070,208 bytes for
``batch_prefill_tmp_v`` at CUDA-graph decode batch 256, starcoderbase-7b 401,604,608."""

from __future__ import annotations

import pytest

from worker_svc.attention.workspace import cta_tile_q, workspace_bytes
from worker_svc.cuda_graph import buckets
from worker_svc.model.default import SHAPES

H200_SMS = 132
OLD_FIXED = 256 * 1024 * 1024


def _heads(shape: str) -> tuple[int, int]:
    s = SHAPES[shape]
    return s["n_head"], s["n_embd"] // s["n_head"]


@pytest.mark.parametrize("shape,asked", [("starcoder", 703_070_208), ("starcoderbase-7b", 401_604_608)])
def test_covers_what_flashinfer_asked_at_graph_batch_256(shape, asked):
    n_head, head_dim = _heads(shape)
    need = workspace_bytes(n_head, 1, head_dim, H200_SMS, buckets(256))
    # tmp_v alone was `asked`; tmp_s (1/head_dim of it) and two alignments come on top
    assert need >= asked + asked // head_dim
    assert need > OLD_FIXED


def test_graph_formula_reproduces_the_measured_tmp_v():
    # padded batch = max(2 * 132, ceil(256 * 48 / 64) + 255) = 447 tiles of 64 rows for 48 heads of 128
    assert cta_tile_q(48, 128) == 64
    assert 48 * 447 * 64 * 128 * 4 == 703_070_208
    assert 32 * 383 * 64 * 128 * 4 == 401_604_608


def test_eager_bound_for_the_1b_shape_is_over_the_old_constant():
    # an eager extend that splits into 264 tiles of 128 rows (16 heads of 128): 279 MB
    assert workspace_bytes(16, 1, 128, H200_SMS) == 16 * 264 * 128 * 129 * 4 + 32
    assert workspace_bytes(16, 1, 128, H200_SMS) > OLD_FIXED


def test_grows_with_the_graph_batch_and_the_heads():
    small = workspace_bytes(48, 1, 128, H200_SMS, buckets(16))
    large = workspace_bytes(48, 1, 128, 1000, buckets(1024))
    assert large > small
    assert workspace_bytes(12, 1, 64, H200_SMS) < workspace_bytes(48, 1, 128, H200_SMS)


def test_rejects_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="multiple"):
        workspace_bytes(10, 3, 64, H200_SMS)
