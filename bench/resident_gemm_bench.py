"""The small decode projections through the resident-weight GEMM (``worker_svc/model/resident_gemm.py``) against
cuBLAS, each behind the kernel that writes its input, to tell where the resident GEMM's time goes at 16-64 rows.

Run 32 (H100) measured it inside the 1B's decode step: tied up to 16 rows, slower at 32 (x1.04) and 64 (x1.09)
rows, against x0.80-0.89 on tiny_starcoder_py. Three readings would explain the 1B: the CTAs after the first wave
(the 1B's c_attn is 144 CTAs of one an SM at 64 rows), x's span read after the wait (``M * KS`` elements a CTA, from
L2), and the split-K fix-up (the tile's last CTA sums ``SPLIT`` float32 partials). Each arm here is one CUDA graph of
``--layers`` distinct weights (so they come from HBM), each projection behind a PDL add + LayerNorm that writes its
input (as in the model: its weights are read while that kernel runs): cuBLAS (``F.linear`` after the same add +
LayerNorm) against the resident GEMM at each ``--specs`` entry ``WARPSxCOLUMNSxSPAN`` (the K span a CTA sums: one
split when it is K's next power of two or more, so the fix-up drops out; a grid of at most one CTA an SM shows
whether the second wave is the cost).

    python -m bench.resident_gemm_bench --shape starcoderbase-1b --rows 16,32,64 --specs 8x32x1024,8x64x512,8x16x2048

Prints us per projection (the add + LayerNorm included in both arms), TB/s of weight read, the grid, the ratio
against cuBLAS of the same run; writes --out/resident_gemm_bench.json. CUDA only (the configurations are built and
checked on any machine: ``arms``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from worker_svc.model.resident_gemm import COLUMNS, WARPS, ResidentMMConfig, next_pow2, workspace_size


def arms(m: int, k: int, n: int, specs: list[str]) -> list[tuple[str, ResidentMMConfig]]:
    """(name, configuration) of each ``WARPSxCOLUMNSxSPAN`` in ``specs`` for x [m, k] @ W[n, k].T: the span capped at
    K's next power of two, the splits to cover K. Raises ValueError for a malformed entry (warps in ``WARPS``, columns
    in ``COLUMNS``, a span that is a power of two >= 16)."""
    out = []
    for spec in specs:
        parts = spec.split("x")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"a spec is WARPSxCOLUMNSxSPAN, got {spec!r}")
        warps, cols, span = (int(p) for p in parts)
        if warps not in WARPS or cols not in COLUMNS or span < 16 or span & (span - 1):
            raise ValueError(f"{spec!r}: warps in {WARPS}, columns in {COLUMNS}, a span that is a power of two >= 16")
        ks = min(span, next_pow2(k))
        out.append((spec, ResidentMMConfig(max(16, next_pow2(m)), cols, ks, ks, -(-k // ks), warps)))
    return out


SHARED_MEMORY = 227 * 1024  # bytes a CTA may take on sm90


def tile_bytes(cfg: ResidentMMConfig) -> int:
    """Shared memory of the ``tl.dot`` operands at least: x's span and the weight slab, 2 bytes an element."""
    return (cfg.block_m + cfg.block_n) * cfg.k_pad * 2


def main() -> None:
    from torch import nn
    import torch.nn.functional as F

    from bench.gemm_bench import graph_time, projections
    from worker_svc.model import fused
    from worker_svc.model.resident_gemm import resident_mm_linear
    from worker_svc.model.skinny_gemm import SplitKWorkspace

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="starcoderbase-1b")
    ap.add_argument("--rows", default="16,32,64")
    ap.add_argument("--specs", default="8x32x1024,8x64x512,8x16x2048,4x32x512")
    ap.add_argument("--layers", type=int, default=24, help="distinct weights per graph")
    ap.add_argument("--hbm-tbs", type=float, default=4.1, help="the bandwidth the fractions are of (TB/s)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    torch.manual_seed(0)
    rows = []
    for name in ("c_attn", "attn.c_proj"):
        k, n = projections(args.shape)[name]
        ws = [torch.randn(n, k, device=dev, dtype=dt) * k ** -0.5 for _ in range(args.layers)]
        bs = [torch.randn(n, device=dev, dtype=dt) * 0.1 for _ in range(args.layers)]
        ln = nn.LayerNorm(k, device=dev, dtype=dt)
        for m in (int(r) for r in args.rows.split(",")):
            h, a = torch.randn(m, k, device=dev, dtype=dt), torch.randn(m, k, device=dev, dtype=dt)
            cands = arms(m, k, n, args.specs.split(","))
            space = [workspace_size(m, n, c) for _, c in cands]
            wsp = SplitKWorkspace(max(f for f, _ in space), max(t for _, t in space), dev)

            def run(cfg):
                for w, b in zip(ws, bs):
                    _, y = fused.add_layer_norm(h, a, ln, pdl=True)
                    if cfg is None:
                        F.linear(y, w, b)
                    else:
                        resident_mm_linear(y, w, b, cfg, wsp, pdl=True)

            base = graph_time(lambda: run(None)) / args.layers
            wbytes = n * k * 2
            print(f"{name:12s} M={m:3d} K={k} N={n}  cuBLAS {base * 1e6:7.2f} us {wbytes / base / 1e12:.2f} TB/s "
                  f"({wbytes / base / 1e12 / args.hbm_tbs:.0%})", flush=True)
            row = {"name": name, "m": m, "k": k, "n": n, "cublas_us": base * 1e6, "arms": []}
            for spec, cfg in cands:
                if tile_bytes(cfg) > SHARED_MEMORY:  # would not launch: say so and time the others
                    row["arms"].append({"spec": spec, "skipped": f"{tile_bytes(cfg)} B of operands > {SHARED_MEMORY}"})
                    print(f"    {spec:12s} skipped: {tile_bytes(cfg)} B of operands in shared memory", flush=True)
                    continue
                t = graph_time(lambda: run(cfg)) / args.layers
                ctas = -(-n // cfg.block_n) * cfg.split
                row["arms"].append({"spec": spec, "split": cfg.split, "ctas": ctas, "us": t * 1e6,
                                    "tbs": wbytes / t / 1e12, "vs_cublas": base / t})
                print(f"    {spec:12s} split {cfg.split:2d} {ctas:4d} CTAs ({ctas / sms:.2f} an SM)  {t * 1e6:7.2f} us "
                      f"{wbytes / t / 1e12:.2f} TB/s  x{base / t:.2f} of cuBLAS", flush=True)
            rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "resident_gemm_bench.json").write_text(json.dumps(
        {"shape": args.shape, "device": torch.cuda.get_device_name(dev), "layers": args.layers, "results": rows},
        indent=1))


if __name__ == "__main__":
    main()
