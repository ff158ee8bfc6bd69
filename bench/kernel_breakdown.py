"""Where a profiled Forward's device time goes: kernel time by kind and the device's idle time between kernels.

Reads a torch.profiler chrome trace (``worker_svc.bench --profile DIR`` writes ``trace-b<B>.json.gz``: one multi-step
decode Forward, its steps replayed from CUDA graphs) and sorts every GPU kernel into a kind by its name: ``gemm``
(cuBLAS / cuBLASLt / Triton GEMM kernels), ``attention`` (flashinfer, the Triton decode attention and its merge),
``norm`` (LayerNorm, the fused residual add + LayerNorm), ``kv_write`` (K/V into the pool), ``other``. Prints, per
kind, the kernels' summed duration and count, per step (``--steps``), and the device's idle time before kernels of
each kind (the time from the end of every kernel before it to its start; with programmatic dependent launch a
kernel starts early and waits, so idle time shows as kernel time: read PDL traces with that in mind).

    python -m bench.kernel_breakdown TRACE.json.gz [--steps 8] [--weight-gb 2.04 --kv-gb 0.9 --hbm-tbs 4.1]
        [--json OUT]

With ``--weight-gb`` / ``--kv-gb`` (bytes a step reads: the layers' weights, the KV) it also prints the rate the GEMMs
and the attention reach and its fraction of ``--hbm-tbs``.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
from pathlib import Path

KINDS = ("gemm", "attention", "norm", "kv_write", "other")


def kind(name: str) -> str:
    """The kind of a kernel, from its name."""
    low = name.lower()
    if "nvjet" in low or "gemm" in low or "xmma" in low or "cutlass" in low or "splitk" in low or "matmul" in low \
            or "skinny_mm" in low or "resident_mv" in low:  # our Triton GEMMs (model/skinny_gemm, resident_gemv)
        return "gemm"
    if "mqa_decode" in low or "flashinfer" in low or "prefill" in low or "attention" in low:
        return "attention"
    if "add_ln" in low or "layer_norm" in low:
        return "norm"
    if "write_kv" in low:
        return "kv_write"
    return "other"


def breakdown(events: list[dict]) -> dict:
    """``events``: the trace's kernel events (``ts``, ``dur`` in us, ``name``). Returns the span, the summed
    kernel time and count per kind, the idle time before kernels of each kind, and the top kernels by time."""
    ev = sorted(events, key=lambda e: e["ts"])
    if not ev:
        raise ValueError("the trace holds no GPU kernel (cat 'kernel'): was it recorded with CUDA activities?")
    time, count, idle, idle_n = (collections.Counter() for _ in range(4))
    by_name, name_n = collections.Counter(), collections.Counter()
    end = ev[0]["ts"]
    for e in ev:
        k = kind(e["name"])
        gap = e["ts"] - end
        if gap > 0:
            idle[k] += gap
            idle_n[k] += 1
        end = max(end, e["ts"] + e["dur"])
        time[k] += e["dur"]
        count[k] += 1
        by_name[e["name"]] += e["dur"]
        name_n[e["name"]] += 1
    return {"span_us": end - ev[0]["ts"], "kernels": len(ev),
            "kinds": {k: {"us": time[k], "count": count[k], "idle_before_us": idle[k], "idle_gaps": idle_n[k]}
                      for k in KINDS},
            "top": [{"name": n, "us": t, "count": name_n[n]} for n, t in by_name.most_common(10)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--steps", type=int, default=8, help="decode steps in the profiled Forward (figures per step)")
    ap.add_argument("--weight-gb", type=float, default=0.0, help="the layers' weights a step reads, GB")
    ap.add_argument("--kv-gb", type=float, default=0.0, help="the KV a step reads, GB")
    ap.add_argument("--hbm-tbs", type=float, default=4.1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    opener = gzip.open if args.trace.suffix == ".gz" else open
    with opener(args.trace, "rt") as f:
        trace = json.load(f)
    r = breakdown([e for e in trace["traceEvents"] if e.get("cat") == "kernel"])
    s = args.steps
    print(f"{args.trace}: {r['kernels']} kernels, span {r['span_us'] / s:.0f} us a step ({s} steps)")
    print(f"{'kind':10s} {'us/step':>8s} {'kernels/step':>13s} {'idle before, us/step':>21s}")
    for k, v in r["kinds"].items():
        print(f"{k:10s} {v['us'] / s:8.1f} {v['count'] / s:13.1f} {v['idle_before_us'] / s:21.1f}")
    idle = sum(v["idle_before_us"] for v in r["kinds"].values())
    print(f"{'total':10s} {sum(v['us'] for v in r['kinds'].values()) / s:8.1f} {r['kernels'] / s:13.1f} {idle / s:21.1f}")
    for what, gb, k in (("GEMMs", args.weight_gb, "gemm"), ("attention", args.kv_gb, "attention")):
        if gb > 0 and r["kinds"][k]["us"] > 0:
            tbs = gb * 1e9 * s / (r["kinds"][k]["us"] * 1e-6) / 1e12
            print(f"{what}: {gb} GB a step in {r['kinds'][k]['us'] / s:.0f} us = {tbs:.2f} TB/s "
                  f"({tbs / args.hbm_tbs:.0%} of {args.hbm_tbs})")
    for t in r["top"][:6]:
        print(f"  {t['us'] / s:8.1f} us/step {t['count'] / s:5.1f}/step {t['us'] / t['count']:7.2f} us  {t['name'][:90]}")
    if args.json:
        args.json.write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
