"""The resident-GEMM bench's configurations, built on the CPU (the timing needs CUDA: bench/resident_gemm_bench.py)."""

from __future__ import annotations

import pytest

from bench.resident_gemm_bench import SHARED_MEMORY, arms, tile_bytes
from worker_svc.model.resident_gemm import ResidentMMConfig


def test_each_spec_covers_k_with_its_span():
    got = dict(arms(64, 2048, 2304, ["8x32x1024", "8x16x4096", "4x64x512"]))
    assert got["8x32x1024"] == ResidentMMConfig(64, 32, 1024, 1024, 2, 8)
    assert got["8x16x4096"] == ResidentMMConfig(64, 16, 2048, 2048, 1, 8)  # capped at K: one split, no fix-up
    assert got["4x64x512"] == ResidentMMConfig(64, 64, 512, 512, 4, 4)
    assert dict(arms(5, 768, 896, ["8x32x512"]))["8x32x512"].block_m == 16  # rows padded to tl.dot's 16


@pytest.mark.parametrize("spec", ["8x32", "2x32x512", "8x48x512", "8x32x500", "8x32x8", "axbxc"])
def test_a_malformed_spec_is_refused(spec):
    with pytest.raises(ValueError):
        arms(64, 2048, 2048, [spec])


def test_a_span_whose_operands_pass_shared_memory_is_flagged():
    (_, wide), = arms(64, 2048, 2304, ["8x16x2048"])
    assert tile_bytes(wide) == (64 + 16) * 2048 * 2 > SHARED_MEMORY  # x's span alone is 256 KB at 64 rows
    (_, fits), = arms(16, 2048, 2304, ["8x16x2048"])
    assert tile_bytes(fits) <= SHARED_MEMORY
