"""bench/hf_baseline.py on the CPU with the embedded default model (float32, 4 prompts x 24 tokens, 8 new
tokens): every baseline generates prompts x max_new_tokens tokens, and the greedy tokens of static-cache
generate, DynamicCache generate, continuous-batching generate_batch and a plain argmax loop over the model
are the same; the CLI runs the compiled static baseline (torch.compile on the CPU) and reports failures as a
typed error with exit status 1; serve_bench's hf phase (bench/hf_phase.py) runs them with a time limit
and its ratio table reads their results."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import time
import types

import pytest
import torch

from bench import hf_baseline as hb
from bench import hf_phase
from worker_svc.model.default import ensure_default_model

ROOT = pathlib.Path(__file__).resolve().parents[2]
BATCH, INPUT_LEN, NEW = 4, 24, 8
SEED = 4  # prompts for which EOS never wins with the default model (the oracle checks it)


@pytest.fixture(scope="module")
def model_path() -> pathlib.Path:
    return ensure_default_model()


@pytest.fixture(scope="module")
def model(model_path):
    return hb.load_model(str(model_path), torch.device("cpu"), torch.float32)


@pytest.fixture(scope="module")
def prompts(model) -> torch.Tensor:
    return hb.random_prompts(BATCH, INPUT_LEN, model.config.vocab_size, seed=SEED)


@pytest.fixture(scope="module")
def oracle(model, prompts) -> torch.Tensor:
    """Greedy continuation by full forwards (no cache), EOS (id 0) never chosen: int64 [BATCH, NEW]."""
    ids = prompts.clone()
    with torch.no_grad():
        for _ in range(NEW):
            logits = model(ids).logits[:, -1, :]
            assert int(logits.argmax(-1).eq(0).sum()) == 0, "EOS would win: pick other prompts (ignore_eos differs)"
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids[:, INPUT_LEN:]


@pytest.fixture(scope="module")
def dynamic_run(model, prompts) -> hb.GenerateRun:
    return hb.run_generate(model, prompts, NEW, cache="dynamic", compile=False)


def test_dynamic_generate_counts_and_greedy(dynamic_run, oracle):
    assert dynamic_run.output_tokens == BATCH * NEW
    assert tuple(dynamic_run.tokens.shape) == (BATCH, NEW)
    assert torch.equal(dynamic_run.tokens, oracle)
    assert dynamic_run.settings["cache_implementation"] == "dynamic" and not dynamic_run.settings["compiled"]
    assert dynamic_run.seconds > 0 and dynamic_run.output_tok_s == BATCH * NEW / dynamic_run.seconds


def test_static_generate_equals_dynamic(model, prompts, dynamic_run):
    run = hb.run_generate(model, prompts, NEW, cache="static", compile=False)
    assert run.output_tokens == BATCH * NEW
    assert torch.equal(run.tokens, dynamic_run.tokens)
    assert run.settings["warmup_new_tokens"] == NEW  # warm-up of the timed shape (static cache size)


def test_generate_batch_equals_dynamic(model, prompts, dynamic_run):
    blocks = hb.cb_blocks_for(BATCH, INPUT_LEN, NEW)
    assert blocks == BATCH * 2  # 32 tokens fit one 256-token page, plus one spare
    run = hb.run_generate_batch(model, prompts.tolist(), NEW, num_blocks=blocks, max_batch_tokens=256)
    assert run.output_tokens == BATCH * NEW
    assert torch.equal(run.tokens, dynamic_run.tokens)
    resolved = run.extra["resolved_cb_config"]
    assert resolved["num_blocks"] == blocks and resolved["max_batch_tokens"] == 256
    assert not hasattr(model, "_cached_continuous_batching_manager")  # destroyed after reading it


def test_generate_batch_short_or_failed_results_raise():
    ok = types.SimpleNamespace(error=None, generated_tokens=[5, 6])
    assert hb._check_cb_outputs({"req_0": ok, "req_1": ok}, 2, 2).tolist() == [[5, 6], [5, 6]]
    with pytest.raises(hb.BaselineError, match="returned 1 results for 2"):
        hb._check_cb_outputs({"req_0": ok}, 2, 2)
    short = types.SimpleNamespace(error=None, generated_tokens=[5])
    with pytest.raises(hb.BaselineError, match="1 of 2 requests"):
        hb._check_cb_outputs({"req_0": ok, "req_1": short}, 2, 2)
    failed = types.SimpleNamespace(error="boom", generated_tokens=[5, 6])
    with pytest.raises(hb.BaselineError, match="boom"):
        hb._check_cb_outputs({"req_0": failed, "req_1": ok}, 2, 2)


def test_run_generate_rejects_compile_without_static_cache(model, prompts):
    with pytest.raises(ValueError, match="static cache"):
        hb.run_generate(model, prompts, NEW, cache="dynamic", compile=True)
    with pytest.raises(ValueError, match="cache must be"):
        hb.run_generate(model, prompts, NEW, cache="paged", compile=False)


def _cli(args: list[str], timeout: float) -> tuple[int, dict]:
    out = args[args.index("--json-out") + 1]
    proc = subprocess.run([sys.executable, "-m", "bench.hf_baseline", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, json.loads(pathlib.Path(out).read_text())


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile's CPU backend (inductor) needs a C++ compiler: install g++")
def test_cli_static_compiled_equals_dynamic(model_path, dynamic_run, tmp_path):
    """The GPU's strongest path, compiled by transformers (torch.compile, inductor) here on the CPU."""
    rc, res = _cli(["--baseline", "static", "--model-path", str(model_path), "--device", "cpu", "--batch", str(BATCH),
                    "--input-len", str(INPUT_LEN), "--output-len", str(NEW), "--seed", str(SEED),
                    "--json-out", str(tmp_path / "s.json")], 240)
    assert rc == 0 and res["ok"], res.get("error")
    assert res["settings"]["compiled"] and res["settings"]["compile_config"]["backend"] == "inductor"
    assert res["output_tokens"] == BATCH * NEW
    assert res["tokens_sha256"] == hb.tokens_digest(dynamic_run.tokens)
    assert res["dynamo_warmup"]["unique_graphs"] >= 1 and res["dynamo_timed"]["unique_graphs"] == 0  # no recompile
    assert res["dynamo_warmup"]["graph_breaks"] == 0
    assert res["compile_seconds"] == pytest.approx(res["warmup_seconds"] - res["seconds"], abs=0.002)


def test_cli_failure_is_a_typed_error(tmp_path):
    rc, res = _cli(["--baseline", "dynamic", "--model-path", str(tmp_path / "missing"), "--device", "cpu",
                    "--json-out", str(tmp_path / "e.json")], 120)
    assert rc == 1 and res["ok"] is False
    assert res["error"]["stage"] == "load" and res["error"]["type"] and str(tmp_path / "missing") in res["error"]["message"]


def test_hf_phase_ratios_over_each_baseline():
    ok = {"ok": True, "output_tok_s": 2000.0, "batch": 64, "input_len": 1024, "output_len": 256, "dtype": "bfloat16",
          "seconds": 8.2, "transformers": "5.17.0"}
    counts = {"graph_breaks": 0, "unique_graphs": 2, "calls_captured": 900, "cudagraph_skips": 1}
    hf = {"reference_tok_s": hf_phase.HF_REFERENCE_TOK_S, "copy_bandwidth_Bps": 4e12, "copy_bandwidth_from": "x",
          "baselines": {"static_compiled": {**ok, "output_tok_s": 6400.0, "compile_seconds": 40.0, "dynamo_warmup": counts,
                                            "dynamo_timed": {**counts, "unique_graphs": 0}},
                        "static_dynamic_cache": ok,
                        "generate_batch_64": {"ok": False, "error": {"type": "TimeoutExpired", "message": "late"}}}}
    over = hf_phase.over_baselines(12800.0, hf)
    assert over == {"static_compiled": 2.0, "static_dynamic_cache": 6.4, "generate_batch_64": None, "reference": 2.0}
    lines = hf_phase.hf_table(hf, {"c64": {"ok": 128, "output_tok_s": 12800.0, "over_hf": over}})
    assert any("TimeoutExpired: late" in ln for ln in lines)
    assert any("compile 40.0 s, graphs 2+0 timed, breaks 0, cudagraph skips 2" in ln for ln in lines)
    row = next(ln for ln in lines if ln.split()[:1] == ["c64"])
    assert row.split() == ["c64", "12800.0", "2.00", "6.40", "n/a", "2.00"]


def test_hf_phase_baseline_process_timeout_and_no_result(tmp_path):
    """A baseline process past the time limit is killed (its whole process group) and recorded as a typed
    error; one that exits without writing its JSON is recorded with its exit status and log tail."""
    pid_file = tmp_path / "child.pid"
    sleeper = [sys.executable, "-c", "import os, subprocess, sys, time; "
               f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
               f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(60)"]
    entry = hf_phase.run_one(sleeper, tmp_path / "none.json", tmp_path / "sleep.log", timeout=4.0)
    assert entry["ok"] is False and entry["error"]["type"] == "TimeoutExpired"
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10  # SIGKILL is delivered asynchronously
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(grandchild)  # killed with the group
    failing = [sys.executable, "-c", "import sys; print('bad model path'); sys.exit(3)"]
    entry = hf_phase.run_one(failing, tmp_path / "none.json", tmp_path / "fail.log", timeout=60.0)
    assert entry["ok"] is False and entry["error"]["type"] == "NoResult"
    assert "exit status 3" in entry["error"]["message"] and "bad model path" in entry["error"]["message"]


def _gone(pid: int) -> bool:
    """The process has exited (no /proc entry, or a zombie awaiting its reaper)."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
