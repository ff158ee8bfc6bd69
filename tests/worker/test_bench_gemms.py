"""The worker bench's GEMM flags on the CPU (worker_svc/bench_gemms.py): a run where no Triton GEMM can take part
(CPU, float32) runs with the defaults, and the resident kernels' flags given there, or malformed, exit with the
reason instead of being ignored."""

from __future__ import annotations

import json

import pytest


def test_a_cpu_float32_run_takes_the_defaults_and_records_no_resident_grid(model_dir, tmp_path):
    """Red before: ``--resident-stream``'s default (the worker's 2 CTAs an SM) made every run without the resident
    kernels exit with "--resident-stream needs the resident kernel"."""
    from worker_svc import bench

    out = tmp_path / "w.json"
    bench.main(["--model-path", str(model_dir), "--device", "cpu", "--dtype", "float32", "--batches", "1",
                "--context", "16", "--prefill", "", "--iters", "1", "--cuda-graph-max-batch", "0",
                "--json-out", str(out)])
    run = json.loads(out.read_text())
    assert run["resident_stream"] == 0 and run["resident_mm_shape"] is None and run["results"]


@pytest.mark.parametrize("flags", [["--resident-stream", "2"], ["--resident-mm-shape", "8x32"],
                                   ["--resident-mm-shape", "8x48"], ["--resident-mm-shape", "2x64"],
                                   ["--resident-mm-shape", "64"], ["--resident-mm-rows", "65"]])
def test_resident_flags_that_cannot_run_exit_with_the_reason(model_dir, flags, capsys):
    from worker_svc import bench

    with pytest.raises(SystemExit):
        bench.main(["--model-path", str(model_dir), "--device", "cpu", "--dtype", "float32", "--batches", "1",
                    "--context", "16", "--prefill", "", "--iters", "1", *flags])
    assert "--resident" in capsys.readouterr().err
