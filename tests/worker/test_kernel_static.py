"""The decode graphs' Triton kernels compiled for sm_90 on the CPU (``bench/kernel_static.py``): every
configuration the 1B and tiny decode steps launch (and the split-K GEMMs of their projections) compiles, spills nothing to local memory, and the decode attention's K/V loads
are asynchronous copies (Triton's pipeliner took them). Also the occupancy arithmetic the survey reports.

A kernel change that breaks the sm_90 compile or starts spilling fails here, before any device time is spent."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.kernel_static import Static, ctas_per_sm

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs Triton importable (pip install triton==3.9.0: its ptxas and "
                                         "cuobjdump compile and read sm_90 code on the CPU)")


def test_ctas_per_sm_follows_the_sm90_limits():
    # registers: 72 a thread round to 2,304 a warp (256-register units): 65,536 / (2,304 x 4) = 7 CTAs of 4 warps;
    # shared memory: 233,472 / (38,912 + 1,024) = 5 -> 5
    assert ctas_per_sm(72, 38912, 4) == 5
    assert ctas_per_sm(64, 0, 4) == 8  # 65,536 / (2,048 x 4)
    assert ctas_per_sm(255, 0, 4) == 2  # 8,192 a warp
    assert ctas_per_sm(16, 0, 1) == 32  # the 32-CTA cap
    assert ctas_per_sm(16, 0, 16) == 4  # 64 warps an SM
    assert ctas_per_sm(32, 120_000, 4) == 1


@needs_triton
def test_decode_kernels_compile_for_sm90_without_spills(tmp_path):
    # its own process: tests/conftest.py runs this one under TRITON_INTERPRET=1, where @triton.jit gives
    # interpreted functions (and compiling beside them broke later interpreter tests)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "static.json"
    subprocess.run([sys.executable, "-m", "bench.kernel_static", "--batches", "1,16,64", "--gemms", "--json",
                    str(out)],
                   env=env, check=True, capture_output=True, timeout=240, cwd=Path(__file__).parents[2])
    rows = [Static(**r) for r in json.loads(out.read_text())]
    kernels = {r.kernel for r in rows}
    assert {"mqa_decode_part", "mqa_decode_merge", "add_ln", "write_kv", "skinny_mm", "chunk_argmax", "combine",
            "resident_mv"} <= kernels
    for r in rows:
        assert r.regs > 0 and r.local == 0, r  # compiled, nothing spilled
        assert 1 <= r.ctas_per_sm <= 32, r
    for r in rows:
        if r.kernel == "mqa_decode_part":
            assert r.ldgsts > 0 and r.mma > 0, r  # K/V through cp.async into shared memory, QK and PV on tensor cores
