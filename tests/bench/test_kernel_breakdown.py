"""bench/kernel_breakdown.py: kernels sorted into kinds by name, idle time charged to the kernel that follows it."""

from __future__ import annotations

import pytest

from bench.kernel_breakdown import breakdown, kind


def test_kernels_are_sorted_into_kinds_by_name():
    assert kind("nvjet_sm90_tst_24x64_64x16_4x1_v_bz_bias_TNN") == "gemm"
    assert kind("skinny_mm") == kind("resident_mv") == "gemm"  # the Triton GEMMs (run 25 counted skinny_mm as other)
    assert kind("mqa_decode_part") == kind("mqa_decode_merge") == "attention"
    assert kind("BatchPrefillWithRaggedKVCacheKernel") == "attention"
    assert kind("add_ln") == "norm"
    assert kind("write_kv") == "kv_write"
    assert kind("void at::native::reduce_kernel<512, 1>") == "other"


def test_idle_time_and_overlap():
    ev = [{"name": "nvjet_a", "ts": 0.0, "dur": 10.0},
          {"name": "mqa_decode_part", "ts": 12.0, "dur": 5.0},   # 2 us idle before it
          {"name": "add_ln", "ts": 15.0, "dur": 4.0},             # overlaps the one before: no idle
          {"name": "write_kv", "ts": 25.0, "dur": 1.0}]           # 6 us idle before it
    r = breakdown(ev)
    assert r["span_us"] == 26.0 and r["kernels"] == 4
    assert r["kinds"]["gemm"]["us"] == 10.0 and r["kinds"]["attention"]["idle_before_us"] == 2.0
    assert r["kinds"]["norm"]["idle_before_us"] == 0.0 and r["kinds"]["kv_write"]["idle_before_us"] == 6.0
    assert r["top"][0] == {"name": "nvjet_a", "us": 10.0, "count": 1}


def test_a_trace_without_kernels_is_an_error():
    with pytest.raises(ValueError, match="no GPU kernel"):
        breakdown([])
