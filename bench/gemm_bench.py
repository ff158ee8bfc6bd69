"""Decode-shape GEMMs on the GPU: cuBLAS (``F.linear``) against the split-K Triton kernel
(``worker_svc/model/skinny_gemm.py``) and, with ``--inductor``, torch.compile's max-autotune choice.

Each candidate runs ``layers`` GEMMs on distinct weights (as a model's layers do, so the weights are read from
HBM and not from L2) inside one CUDA graph; the time per GEMM is the replay time over ``layers``. Printed per
(shape, M): microseconds, the weight bytes over that time (TB/s) and its fraction of ``--hbm-tbs`` (4.1 TB/s,
the H200's measured device-to-device copy, ../shared/gpu/README.md), and the ratio to cuBLAS in the same run.
The Triton kernel's configuration is swept (tile sizes, K splits) and the best kept; its error against a
float32 reference is checked before it is timed.

    python -m bench.gemm_bench --shape starcoderbase-1b --rows 1,64,256 --out DIR [--inductor]

Writes DIR/gemm_bench.json. CUDA only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from worker_svc.model import cublaslt
from worker_svc.model.default import SHAPES
from worker_svc.model.skinny_gemm import GemmConfig, SkinnyLinear


def projections(shape: str) -> dict[str, tuple[int, int]]:
    """name -> (K, N) of one layer's projections and the lm_head for a named shape."""
    cfg = SHAPES[shape]
    d, f = cfg["n_embd"], cfg["n_inner"]
    kv = (d // cfg["n_head"]) * (1 if cfg["multi_query"] else cfg["n_head"])
    return {"c_attn": (d, d + 2 * kv), "attn.c_proj": (d, d), "c_fc": (d, f), "mlp.c_proj": (f, d),
            "lm_head": (d, cfg.get("vocab_size", 49152))}


def graph_time(fn, reps: int = 20) -> float:
    """Seconds per replay of a CUDA graph of ``fn()`` (``cublaslt.graph_seconds``: warmed, captured, replayed)."""
    return cublaslt.graph_seconds(fn, reps)


def configs(m: int, k: int, n: int, sms: int) -> list[GemmConfig]:
    """Triton configurations worth timing for [m, k] x [k, n]: grids of about 1-2 waves over ``sms``."""
    block_m = 16 if m <= 16 else 64 if m <= 64 else 128 if m <= 128 else 64
    out = []
    for bn, bk, split, stages in itertools.product((32, 64, 128), (64, 128, 256), (1, 2, 3, 4, 6, 8, 12, 16),
                                                   (3, 4)):
        tiles = -(-n // bn) * -(-m // block_m)
        ctas = tiles * split
        if k // split < bk or ctas < sms // 2 or ctas > 4 * sms:
            continue
        if (block_m + bn) * bk * 2 * stages > 200 * 1024:  # the stages' x and W tiles in shared memory
            continue
        out.append(GemmConfig(block_m, bn, bk, split, 4, stages))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="starcoderbase-1b", choices=sorted(set(SHAPES) - {"default"}))
    ap.add_argument("--rows", default="1,64,256", help="comma-separated M values (batch rows)")
    ap.add_argument("--layers", type=int, default=24, help="distinct weights per graph")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--hbm-tbs", type=float, default=4.1)
    ap.add_argument("--inductor", action="store_true", help="also time torch.compile max-autotune (slow)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), getattr(torch, args.dtype)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows = [int(r) for r in args.rows.split(",")]
    results = []
    for name, (k, n) in projections(args.shape).items():
        layers = 2 if name == "lm_head" else args.layers
        ws = [torch.randn(n, k, device=dev, dtype=dt) * k ** -0.5 for _ in range(layers)]
        bs = [torch.randn(n, device=dev, dtype=dt) * 0.1 for _ in range(layers)]
        wbytes = n * k * ws[0].element_size()
        for m in rows:
            x = torch.randn(m, k, device=dev, dtype=dt)
            ref = F.linear(x.float(), ws[0].float(), bs[0].float())
            t_cublas = graph_time(lambda: [F.linear(x, w, b) for w, b in zip(ws, bs)]) / layers
            row = {"name": name, "k": k, "n": n, "m": m, "weight_mb": wbytes / 1e6,
                   "cublas_us": t_cublas * 1e6, "cublas_tbs": wbytes / t_cublas / 1e12,
                   "cublas_err": (F.linear(x, ws[0], bs[0]).float() - ref).abs().max().item()}
            best = None
            t0 = time.time()
            for cfg in configs(m, k, n, sms):
                lins = [SkinnyLinear(w, b, m, cfg) for w, b in zip(ws, bs)]
                err = (lins[0](x).float() - ref).abs().max().item()
                if err > 4 * row["cublas_err"] + 1e-2:
                    raise AssertionError(f"{name} m={m} {cfg}: error {err} against cuBLAS's {row['cublas_err']}")
                t = graph_time(lambda: [lin(x) for lin in lins]) / layers
                if best is None or t < best[0]:
                    best = (t, cfg, err)
            if best is not None:
                t, cfg, err = best
                row.update(triton_us=t * 1e6, triton_tbs=wbytes / t / 1e12, triton_err=err,
                           triton_cfg=cfg.__dict__, triton_vs_cublas=t_cublas / t, sweep_s=time.time() - t0)
            if args.inductor:
                t0 = time.time()
                comp = torch.compile(lambda x, w, b: F.linear(x, w, b), mode="max-autotune-no-cudagraphs",
                                     dynamic=False)
                comp(x, ws[0], bs[0])
                t = graph_time(lambda: [comp(x, w, b) for w, b in zip(ws, bs)]) / layers
                row.update(inductor_us=t * 1e6, inductor_tbs=wbytes / t / 1e12, inductor_vs_cublas=t_cublas / t,
                           inductor_compile_s=time.time() - t0)
                torch._dynamo.reset()
            results.append(row)
            line = (f"{name:12s} M={m:4d} K={k:5d} N={n:6d}  cuBLAS {row['cublas_us']:7.2f} us "
                    f"{row['cublas_tbs']:.2f} TB/s ({row['cublas_tbs'] / args.hbm_tbs:.0%})")
            if "triton_us" in row:
                line += (f" | split-K {row['triton_us']:7.2f} us {row['triton_tbs']:.2f} TB/s "
                         f"({row['triton_tbs'] / args.hbm_tbs:.0%}) x{row['triton_vs_cublas']:.2f} {cfg}")
            if "inductor_us" in row:
                line += f" | inductor {row['inductor_us']:7.2f} us x{row['inductor_vs_cublas']:.2f}"
            print(line, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gemm_bench.json").write_text(json.dumps({"shape": args.shape, "dtype": args.dtype,
                                                          "device": torch.cuda.get_device_name(dev),
                                                          "results": results}, indent=1))


if __name__ == "__main__":
    main()
