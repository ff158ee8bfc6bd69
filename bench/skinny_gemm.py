"""The decode projections at small M: cuBLAS (``F.linear``, what the model runs) against the Triton kernel of
``worker_svc/model/skinny_gemm.py`` over its candidate configurations, side by side in one process (GPU).

For each model shape, projection (c_attn, attn c_proj, c_fc, mlp c_proj) and M, both are timed as CUDA-graph
replays (launch cost excluded, as in the served decode graphs) of calls that cycle through enough copies of
the weight to exceed the L2 cache 4x (a 9 MB weight called again and again stays in the H200's 50 MB L2 and
reads at twice the memory bandwidth: the first survey, bench/results/h200-run6/skinny-l2-hot.txt, made that
mistake); printed: cuBLAS us, the best
Triton us and its configuration, their ratio, and the weight-read floor (weight bytes over the measured copy
bandwidth). Each Triton result is checked against a float32 reference first (a config that is wrong fails
the run).

    python -m bench.skinny_gemm --shapes starcoderbase-1b,tiny_starcoder_py --ms 1,16,64,128 --json-out F
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from worker_svc.model import skinny_gemm
from worker_svc.model.default import model_config

L2_BYTES = 50 << 20  # H200 (H100: 50 MB too); the weights cycled through are 4x this


def graph_time(fn, reps: int, iters: int = 20) -> float:
    """Seconds per call of ``fn(i)`` replayed from a CUDA graph of calls i = 0..reps-1 (median of ``iters``)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / reps)
    return sorted(times)[len(times) // 2]


def copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write counted)."""
    src = torch.empty(1 << 29, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    secs = graph_time(lambda i: dst.copy_(src), 4, iters=5)
    return 2 * src.numel() * 2 / secs


def projections(shape: str) -> dict[str, tuple[int, int]]:
    """(N, K) of the four projections of ``shape``."""
    c = model_config(shape)
    n, inner = c["n_embd"], c.get("n_inner") or 4 * c["n_embd"]
    head_dim = n // c["n_head"]
    kv = 1 if c.get("multi_query", True) else c["n_head"]
    return {"c_attn": (n + 2 * kv * head_dim, n), "attn_proj": (n, n), "c_fc": (inner, n), "mlp_proj": (n, inner)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="starcoderbase-1b,tiny_starcoder_py")
    ap.add_argument("--ms", default="1,16,64,128")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    dtype = torch.bfloat16
    bw = copy_bandwidth()
    print(f"# copy bandwidth {bw / 1e9:.0f} GB/s; times are us per call (CUDA-graph replay)", flush=True)
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for shape in args.shapes.split(","):
        for name, (n, k) in projections(shape).items():
            copies = max(8, -(-4 * L2_BYTES // (n * k * 2)))
            ws = [(torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(dtype) for _ in range(copies)]
            b = (torch.randn(n, generator=g, device="cuda") * 0.1).to(dtype)
            w = ws[0]
            floor = n * k * 2 / bw  # weight bytes read once at the copy rate (read + write bytes per second)
            for m in (int(s) for s in args.ms.split(",")):
                x = torch.randn(m, k, generator=g, device="cuda").to(dtype)
                ref = (x.float() @ w.float().T + b.float())
                cublas = graph_time(lambda i: F.linear(x, ws[i % copies], b), copies)
                best = None
                for cfg in skinny_gemm.candidates(m):
                    if not skinny_gemm.fits(cfg, k):
                        continue
                    out = skinny_gemm.linear(x, w, b, cfg)
                    err = (out.float() - ref).abs().max().item()
                    if err > 0.05 * ref.abs().max().item():
                        raise AssertionError(f"{shape} {name} m={m} {cfg}: max error {err}")
                    t = graph_time(lambda i: skinny_gemm.linear(x, ws[i % copies], b, cfg), copies, iters=10)
                    if best is None or t < best[0]:
                        best = (t, cfg)
                rec = {"shape": shape, "proj": name, "m": m, "n": n, "k": k, "cublas_us": cublas * 1e6,
                       "triton_us": best[0] * 1e6, "config": best[1].__dict__, "floor_us": floor * 1e6,
                       "ratio_cublas_over_triton": cublas / best[0]}
                rows.append(rec)
                print(f"{shape:18s} {name:9s} M={m:4d} N={n:5d} K={k:5d}: cuBLAS {cublas * 1e6:7.2f}  triton "
                      f"{best[0] * 1e6:7.2f} ({cublas / best[0]:4.2f}x)  floor {floor * 1e6:6.2f}  {best[1]}",
                      flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"copy_bandwidth": bw, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
