"""bench/host_overhead.py runs end to end on a small case (it drives the real scheduler and worker parts, so a
change of their signatures breaks it: session 6's ``continuation_batch(plan, first, slots)`` did, unnoticed),
and writes every phase's figure."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_host_overhead_runs_and_reports_every_phase(tmp_path: pathlib.Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.host_overhead", "--batches", "2", "--steps", "2",
                           "--forwards", "2", "--warmup", "1", "--context", "160", "--out", str(tmp_path),
                           "--label", "t"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "host_overhead_t.json").read_text())["batches"]["2"]
    for side, phase in (("worker", "steps"), ("worker", "step_feed"), ("worker", "tables_behind"), ("scheduler", "next_batch"),
                        ("scheduler", "process"), ("worker", "total"), ("scheduler", "total")):
        assert result[side][phase] > 0, (side, phase)
