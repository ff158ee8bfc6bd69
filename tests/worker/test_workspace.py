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


def test_graph_term_decides_on_a_gpu_with_fewer_sms():
    # 58 SMs (an L4): eager 116 tiles of 128 rows; graphs at 256: max(116, 192 + 255) = 447 tiles of 64
    eager = 48 * 116 * 128 * 129 * 4 + 32
    graph = 48 * 447 * 64 * 129 * 4 + 32
    assert graph > eager
    assert workspace_bytes(48, 1, 128, 58) == eager
    assert workspace_bytes(48, 1, 128, 58, buckets(256)) == graph


def test_below_sm80_the_small_tile_is_64_rows():
    assert cta_tile_q(12, 64, sm_major=7) == 64 and cta_tile_q(12, 64, sm_major=9) == 16
    # the default model's 12 heads of 64 on a T4 (40 SMs, sm75) with graphs to 256: 64-row tiles
    t4 = workspace_bytes(12, 1, 64, 40, buckets(256), sm_major=7)
    assert t4 == 12 * (-(-256 * 12 // 64) + 255) * 64 * 65 * 4 + 32
    assert t4 > workspace_bytes(12, 1, 64, 40, buckets(256), sm_major=9)


def test_start_up_error_names_the_size_and_the_term_that_decides_it(monkeypatch):
    import types

    import torch

    from worker_svc.attention import workspace

    props = types.SimpleNamespace(multi_processor_count=58, major=8)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (100 * 2**20, 80 * 2**30))

    def no_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(torch, "empty", no_memory)
    with pytest.raises(RuntimeError, match=r"676 MiB workspace .* 100 MiB .*lower --cuda-graph-max-batch"):
        workspace.allocate_workspace(48, 1, 128, "cuda:0", buckets(256))
    with pytest.raises(RuntimeError, match=r"351 MiB workspace .*eager plans decide it"):
        workspace.allocate_workspace(48, 1, 128, "cuda:0")


def test_whole_extend_graphs_cost_only_the_15b_shape_more_on_the_h200():
    # one request of T = 1,024 rows in graph mode: max(264, ceil(1024 * G / 128)) tiles of 128 rows; G = 48 for
    # starcoder (384 tiles: 1.22 GB against the eager 837 MB), at most 264 for the others (no more than eager)
    from worker_svc.extend_graph import token_buckets

    whole = token_buckets(1024)
    assert workspace_bytes(48, 1, 128, H200_SMS, buckets(256), extend_tokens=whole) == 48 * 384 * 128 * 129 * 4 + 32
    assert workspace_bytes(48, 1, 128, H200_SMS, buckets(256)) == 48 * 264 * 128 * 129 * 4 + 32
    for shape in ("starcoderbase-7b", "starcoderbase-3b", "starcoderbase-1b", "tiny_starcoder_py"):
        n_head, head_dim = _heads(shape)
        assert workspace_bytes(n_head, 1, head_dim, H200_SMS, buckets(256), extend_tokens=whole) == \
            workspace_bytes(n_head, 1, head_dim, H200_SMS, buckets(256)), shape
    # below 704 tokens (704 * 48 / 128 = 264 tiles) starcoder needs no more either
    eager = workspace_bytes(48, 1, 128, H200_SMS)
    assert workspace_bytes(48, 1, 128, H200_SMS, extend_tokens=token_buckets(704)) == eager
