"""The ``hf`` phase of ``bench/serve_bench.py``: transformers' own generation paths on the same checkpoint,
GPU and lengths, each ``python -m bench.hf_baseline`` in its own process group with a time limit, and the
ratios of our throughput over each (and over issue 5's reference figure).

Baselines (``HF_BASELINES``, run in this order): ``static_compiled`` (static-batch ``generate`` of
``--hf-batch`` prompts, static cache + torch.compile), ``static_dynamic_cache`` (the same with the default
DynamicCache, eager), ``generate_batch_64`` and ``generate_batch_256`` (continuous batching over 64 / 256
requests). A baseline that fails, leaves no JSON or runs past the limit is recorded as ``{"ok": false,
"error": {"type", "message", "stage"}}`` and the next one still runs.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Issue 5: transformers static-batch generate measured on the H200 (starcoderbase-1b shape, bf16, 64 x 1,024 in
# x 256 out, after warm-up): about 6,400 output tokens/s.
HF_REFERENCE_TOK_S = 6400.0
# name -> bench.hf_baseline arguments ("{hf_batch}" is --hf-batch); the order they run in.
HF_BASELINES = {
    "static_compiled": ["--baseline", "static", "--batch", "{hf_batch}"],
    "static_dynamic_cache": ["--baseline", "dynamic", "--batch", "{hf_batch}"],
    "generate_batch_64": ["--baseline", "generate_batch", "--batch", "64"],
    "generate_batch_256": ["--baseline", "generate_batch", "--batch", "256"],
}


def run_baselines(hf: dict, names: list[str], *, model: str, out: pathlib.Path, input_len: int, output_len: int,
                  hf_batch: int, gpu: bool, timeout: float, on_result: Callable[[], None],
                  log: Callable[[str], None]) -> None:
    """Runs ``names`` (keys of HF_BASELINES) in order into ``hf["baselines"][name]``; the first successful
    one's copy bandwidth and parameter bytes go to ``hf`` (for the bandwidth limit of a decode step).
    Files: ``out/hf_<name>.json`` (the baseline's result) and ``out/hf_<name>.log`` (its output).
    ``on_result()`` after each baseline (to save). Raises ValueError naming unknown baselines, before any run."""
    unknown = [n for n in names if n not in HF_BASELINES]
    if unknown:
        raise ValueError(f"--hf-baselines: {unknown} not in {list(HF_BASELINES)}")
    for name in names:
        json_path, log_path = out / f"hf_{name}.json", out / f"hf_{name}.log"
        json_path.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "bench.hf_baseline", *(x.format(hf_batch=hf_batch) for x in HF_BASELINES[name]),
                "--model-path", model, "--input-len", str(input_len), "--output-len", str(output_len),
                "--json-out", str(json_path)] + ([] if gpu else ["--device", "cpu"])
        t = time.monotonic()
        entry = run_one(argv, json_path, log_path, timeout)
        entry["process_seconds"] = round(time.monotonic() - t, 1)
        hf["baselines"][name] = entry
        if entry.get("ok") and "copy_bandwidth_Bps" not in hf:
            hf.update(copy_bandwidth_Bps=entry["copy_bandwidth_Bps"], param_bytes=entry["param_bytes"],
                      copy_bandwidth_from=name)
        on_result()
        log(f"hf {name}: " + (f"{entry['output_tok_s']} tok/s in {entry['seconds']} s" if entry.get("ok")
                              else f"FAILED {entry['error']['type']}: {entry['error']['message'][:300]}")
            + f" (process {entry['process_seconds']} s)")


def run_one(argv: list[str], json_path: pathlib.Path, log_path: pathlib.Path, timeout: float) -> dict:
    """One baseline process (its own session, output to ``log_path``); its JSON plus ``exit_status``, or
    ``{"ok": False, "error": {...}}``: ``TimeoutExpired`` after ``timeout`` seconds (the whole process
    group is killed, torch.compile's workers too), ``NoResult`` when it exits without writing ``json_path``
    (the message has the exit status and the log's tail)."""
    with open(log_path, "w") as logf:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"ok": False, "error": {"type": "TimeoutExpired", "stage": "process",
                                           "message": f"no result within --hf-timeout {timeout} s (killed); log {log_path}"}}
    if not json_path.exists():
        tail = log_path.read_text(errors="replace")[-1500:]
        return {"ok": False, "error": {"type": "NoResult", "stage": "process",
                                       "message": f"exit status {rc} and no JSON; log tail: {tail}"}}
    entry = json.loads(json_path.read_text())
    entry["exit_status"] = rc
    return entry


def over_baselines(tok_s: float, hf: dict) -> dict:
    """Our output tok/s over each transformers baseline of ``hf`` (results["hf"]): {name: ratio, or None
    where that baseline has no figure}, plus "reference" = over issue 5's HF_REFERENCE_TOK_S."""
    out = {name: (round(tok_s / b["output_tok_s"], 2) if b.get("ok") else None)
           for name, b in hf.get("baselines", {}).items()}
    out["reference"] = round(tok_s / hf["reference_tok_s"], 2)
    return out


def hf_table(hf: dict, phases: dict) -> list[str]:
    """Lines: each transformers baseline (tok/s, seconds, compile seconds, or its error), then our c64 and
    c256 (and c64_k1) tok/s over each baseline and over the reference figure."""
    rows = ["transformers baselines (same GPU, same checkpoint and lengths"
            + (f"; from {hf['loaded_from']}" if "loaded_from" in hf else "") + "):"]
    for name, b in hf.get("baselines", {}).items():
        if b.get("ok"):
            extra = ""
            if "compile_seconds" in b:  # static_compiled: what torch.compile did (recompiles in the timed run, CUDA graphs skipped)
                w, t = b["dynamo_warmup"], b["dynamo_timed"]
                extra = (f", compile {b['compile_seconds']} s, graphs {w['unique_graphs']}+{t['unique_graphs']} timed, "
                         f"breaks {w['graph_breaks'] + t['graph_breaks']}, cudagraph skips {w['cudagraph_skips'] + t['cudagraph_skips']}")
            rows.append(f"  {name:<22}{b['output_tok_s']:>10.1f} tok/s  ({b['batch']} x {b['input_len']} in x "
                        f"{b['output_len']} out, {b['dtype']}, {b['seconds']} s{extra}; transformers {b['transformers']})")
        else:
            rows.append(f"  {name:<22}{'FAILED':>10}        {b['error']['type']}: {b['error']['message'][:200]}")
    rows.append(f"  {'issue 5 reference':<22}{hf['reference_tok_s']:>10.1f} tok/s  (static generate on this H200, as reported)")
    if "copy_bandwidth_Bps" in hf:
        rows.append(f"  copy bandwidth {hf['copy_bandwidth_Bps'] / 1e12:.2f} TB/s (from {hf['copy_bandwidth_from']})")
    names = list(hf.get("baselines", {})) + ["reference"]
    rows.append("ours over each: " + f"{'phase':<8}{'tok/s':>10}" + "".join(f"{n:>22}" for n in names))
    for ph_name in ("c64", "c256", "c64_k1"):
        p = phases.get(ph_name)
        if not p or not p.get("ok"):
            continue
        over = p.get("over_hf") or over_baselines(p["output_tok_s"], hf)
        cells = "".join(f"{over[n]:>22.2f}" if over.get(n) is not None else f"{'n/a':>22}" for n in names)
        rows.append(f"{'':<16}{ph_name:<8}{p['output_tok_s']:>10.1f}{cells}")
    return rows
