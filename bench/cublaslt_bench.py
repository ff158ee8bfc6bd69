"""Decode-shape projections through every algorithm cuBLASLt's heuristic offers, against ``F.linear``.

torch's ``F.linear`` runs the heuristic's first answer. For each projection of a shape and each M, this
asks ``cublasLtMatmulAlgoGetHeuristic`` for up to ``--candidates`` algorithms (``worker_svc/model/cublaslt.py``),
checks each one's result against a float32 reference, and times it as ``gemm_bench`` does: ``layers``
distinct weights per CUDA graph, so the weights come from HBM. ``c_fc`` runs with the bias + tanh-GELU
epilogue, against ``fused.mlp_up`` (what the model runs); the others with the bias epilogue against
``F.linear``; the lm_head without bias. Then the layer sequence (c_attn -> attn c_proj -> c_fc -> mlp c_proj,
x ``layers``, each GEMM's input the previous one's output where the shapes allow) with each projection's
fastest candidate against the same sequence through torch, both as one CUDA graph: the ratio a decode step's
GEMMs would see.

    python -m bench.cublaslt_bench --shape starcoderbase-1b --rows 1,64,256 --out DIR

Prints us per GEMM, TB/s of weight read and its fraction of ``--hbm-tbs``, and the ratio against torch in
the same run; writes DIR/cublaslt_bench.json. CUDA only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from bench.gemm_bench import graph_time, projections
from worker_svc.model import cublaslt
from worker_svc.model.default import SHAPES


def survey(name: str, k: int, n: int, m: int, layers: int, dev, dt, count: int, workspace: torch.Tensor) -> dict:
    """Every candidate of one (projection, M), timed; returns the row with the candidates sorted by time."""
    gelu, bias = name == "c_fc", name != "lm_head"
    ws = [torch.randn(n, k, device=dev, dtype=dt) * k ** -0.5 for _ in range(layers)]
    bs = [torch.randn(n, device=dev, dtype=dt) * 0.1 if bias else None for _ in range(layers)]
    x = torch.randn(m, k, device=dev, dtype=dt)
    op = lambda x, w, b: cublaslt.torch_linear(x, SimpleNamespace(weight=w, bias=b), gelu)  # noqa: E731
    ref = (F.gelu(F.linear(x.float(), ws[0].float(), bs[0].float()), approximate="tanh") if gelu
           else F.linear(x.float(), ws[0].float(), None if bs[0] is None else bs[0].float()))
    t_torch = graph_time(lambda: [op(x, w, b) for w, b in zip(ws, bs)]) / layers
    torch_err = (op(x, ws[0], bs[0]).float() - ref).abs().max().item()
    wbytes = n * k * 2
    lt = cublaslt.LtMatmul(m, k, n, dt, bias=bias, gelu=gelu, workspace_bytes=workspace.numel())
    outs = [torch.empty(m, n, device=dev, dtype=dt) for _ in range(layers)]
    cands, offered = [], lt.candidates(count, bias_ptr=bs[0].data_ptr() if bias else 256)
    for i, c in enumerate(offered):
        err = (lt.run(x, ws[0], bs[0], outs[0], c, workspace).float() - ref).abs().max().item()
        row = {"rank": i, "config": c.config, "waves": c.waves, "workspace": c.workspace_bytes, "err": err}
        if err > 4 * torch_err + 2e-2:
            row["rejected"] = "error"
        else:
            t = graph_time(lambda: [lt.run(x, w, b, o, c, workspace) for w, b, o in zip(ws, bs, outs)]) / layers
            row.update(us=t * 1e6, tbs=wbytes / t / 1e12, vs_torch=t_torch / t)
        cands.append(row)
    timed = sorted((c for c in cands if "us" in c), key=lambda c: c["us"])
    return {"name": name, "k": k, "n": n, "m": m, "weight_mb": wbytes / 1e6, "torch_us": t_torch * 1e6,
            "torch_tbs": wbytes / t_torch / 1e12, "torch_err": torch_err, "candidates": timed +
            [c for c in cands if "us" not in c], "_lt": lt, "_best": offered[timed[0]["rank"]] if timed else None}


def sequence(shape: str, m: int, layers: int, dev, dt, chosen: dict, workspace: torch.Tensor) -> dict:
    """A decode step's four projections x ``layers`` as one graph: torch's ops against the chosen candidates.
    ``chosen``: name -> (LtMatmul, Candidate)."""
    p = projections(shape)
    names = ["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"]
    w = {nm: [torch.randn(p[nm][1], p[nm][0], device=dev, dtype=dt) * p[nm][0] ** -0.5 for _ in range(layers)]
         for nm in names}
    b = {nm: [torch.randn(p[nm][1], device=dev, dtype=dt) * 0.1 for _ in range(layers)] for nm in names}
    d = p["attn.c_proj"][0]
    h = torch.randn(m, d, device=dev, dtype=dt)
    bufs = {nm: torch.empty(m, p[nm][1], device=dev, dtype=dt) for nm in names}

    def run_torch():
        for i in range(layers):
            qkv = F.linear(h, w["c_attn"][i], b["c_attn"][i])
            o = F.linear(qkv[:, :d].contiguous(), w["attn.c_proj"][i], b["attn.c_proj"][i])
            up = cublaslt.torch_linear(o, SimpleNamespace(weight=w["c_fc"][i], bias=b["c_fc"][i]), True)
            F.linear(up, w["mlp.c_proj"][i], b["mlp.c_proj"][i])

    def run_lt():
        for i in range(layers):
            lt, c = chosen["c_attn"]
            qkv = lt.run(h, w["c_attn"][i], b["c_attn"][i], bufs["c_attn"], c, workspace)
            lt, c = chosen["attn.c_proj"]
            o = lt.run(qkv[:, :d].contiguous(), w["attn.c_proj"][i], b["attn.c_proj"][i], bufs["attn.c_proj"], c,
                       workspace)
            lt, c = chosen["c_fc"]
            up = lt.run(o, w["c_fc"][i], b["c_fc"][i], bufs["c_fc"], c, workspace)
            lt, c = chosen["mlp.c_proj"]
            lt.run(up, w["mlp.c_proj"][i], b["mlp.c_proj"][i], bufs["mlp.c_proj"], c, workspace)

    t_torch, t_lt = graph_time(run_torch), graph_time(run_lt)
    return {"m": m, "layers": layers, "torch_us": t_torch * 1e6, "lt_us": t_lt * 1e6, "lt_vs_torch": t_torch / t_lt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="starcoderbase-1b", choices=sorted(set(SHAPES) - {"default"}))
    ap.add_argument("--rows", default="1,64,256", help="comma-separated M values (batch rows)")
    ap.add_argument("--layers", type=int, default=24, help="distinct weights per graph")
    ap.add_argument("--candidates", type=int, default=16, help="algorithms asked of the heuristic per GEMM")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--hbm-tbs", type=float, default=4.1, help="the bandwidth the fractions are of (TB/s)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), getattr(torch, args.dtype)
    workspace = torch.empty(32 << 20, dtype=torch.uint8, device=dev)
    results, seqs = [], []
    for m in (int(r) for r in args.rows.split(",")):
        chosen = {}
        for name, (k, n) in projections(args.shape).items():
            row = survey(name, k, n, m, 2 if name == "lm_head" else args.layers, dev, dt, args.candidates,
                         workspace)
            lt, best = row.pop("_lt"), row.pop("_best")
            if best is not None:
                chosen[name] = (lt, best)
            results.append(row)
            top = row["candidates"][0] if row["candidates"] and "us" in row["candidates"][0] else None
            line = (f"{name:12s} M={m:4d} K={k:5d} N={n:6d}  torch {row['torch_us']:7.2f} us "
                    f"{row['torch_tbs']:.2f} TB/s ({row['torch_tbs'] / args.hbm_tbs:.0%})")
            if top:
                line += (f" | Lt best of {len(row['candidates'])} {top['us']:7.2f} us {top['tbs']:.2f} TB/s "
                         f"x{top['vs_torch']:.2f} rank {top['rank']} {top['config']} ws {top['workspace']}")
            print(line, flush=True)
        if all(nm in chosen for nm in ("c_attn", "attn.c_proj", "c_fc", "mlp.c_proj")):
            s = sequence(args.shape, m, args.layers, dev, dt, chosen, workspace)
            seqs.append(s)
            print(f"sequence M={m:4d}: torch {s['torch_us']:8.1f} us, Lt best {s['lt_us']:8.1f} us, "
                  f"x{s['lt_vs_torch']:.3f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cublaslt_bench.json").write_text(json.dumps(
        {"shape": args.shape, "dtype": args.dtype, "device": torch.cuda.get_device_name(dev),
         "results": results, "sequences": seqs}, indent=1))


if __name__ == "__main__":
    main()
