"""A decode step's projections with the next projection's weights read into L2 on a side stream, against without.

Why: at decode batch sizes every projection is a read of its weights, yet the 1B's run at 1.3-2.7 TB/s (H200 run 22,
``cublaslt_bench``: c_attn 9.4 MB in 6.75 us at M = 64; no cuBLASLt algorithm does better): each kernel is a few
microseconds long, and its ramp-up and tail leave HBM idle. The weights do not depend on the activations, so they
can be read ahead. Here a Triton kernel on a second stream of the same CUDA graph loads projection j+d's weights with
the ``evict_last`` L2 policy while projection j runs (d = ``--distances``); projection j+d waits for it (an event)
and then finds its weights in L2 (50 MB on the H100 / H200). The main stream's sequence is the same in every arm
(``c_attn -> attn.c_proj -> c_fc -> mlp.c_proj`` x layers, through ``cublaslt.torch_linear``: what the model runs),
optionally with a stand-in for each layer's attention between ``c_attn`` and ``attn.c_proj`` (``--kv-mb``: a read
of that many MB, as decode attention reads the KV). Arms:

- ``base``: the main stream alone;
- ``ahead d``: weights read d projections ahead, joined before their projection;
- ``ahead d nojoin``: the same without the join (what an unordered prefetch would give; the projection may run
  before its weights are in L2);
- ``stream``: the reading kernel alone over all the weights, one stream (the bandwidth this reader reaches).

    python -m bench.l2_prefetch_bench --shape starcoderbase-1b --rows 1,64,256 --out DIR

Prints us per step-equivalent (all layers), the ratio against ``base`` in the same run and the weights' read rate
(and its fraction of ``--hbm-tbs``); writes DIR/l2_prefetch_bench.json. CUDA and Triton only.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path
from types import SimpleNamespace

import torch

from bench.gemm_bench import graph_time, projections
from worker_svc.model import cublaslt
from worker_svc.model.default import SHAPES

NAMES = ("c_attn", "attn.c_proj", "c_fc", "mlp.c_proj")


@functools.cache
def _touch_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def touch(w_ptr, n, sink_ptr, BLOCK: tl.constexpr):
        """Loads BLOCK int32 of w per program with the evict_last policy; stores one sum only in the (never
        expected) case it equals a sentinel, so the loads are kept and nothing else is written."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(w_ptr + offs, mask=offs < n, other=0, eviction_policy="evict_last")
        s = tl.sum(x, axis=0)
        if s == -1234567891:
            tl.store(sink_ptr, s)

    return touch


def touch(w: torch.Tensor, sink: torch.Tensor, block: int = 8192) -> None:
    """Reads every byte of ``w`` (contiguous, a multiple of 4 bytes) into L2 with the evict_last policy."""
    flat = w.view(torch.int32).view(-1)
    n = flat.numel()
    _touch_kernel()[(-(-n // block),)](flat, n, sink, BLOCK=block, num_warps=8)


def build(shape: str, m: int, layers: int, kv_mb: float, dev, dt) -> SimpleNamespace:
    """Weights, biases, activations and the attention stand-in's buffer for one row count."""
    p = projections(shape)
    lin = {nm: [SimpleNamespace(weight=torch.randn(p[nm][1], p[nm][0], device=dev, dtype=dt) * p[nm][0] ** -0.5,
                                bias=torch.randn(p[nm][1], device=dev, dtype=dt) * 0.1) for _ in range(layers)]
           for nm in NAMES}
    d = p["attn.c_proj"][0]
    kv = [torch.randn(int(kv_mb * 1e6) // 2, device=dev, dtype=dt) for _ in range(layers)] if kv_mb > 0 else []
    order = [(nm, i) for i in range(layers) for nm in NAMES]  # the projections in step order
    return SimpleNamespace(lin=lin, h=torch.randn(m, d, device=dev, dtype=dt), d=d, kv=kv, order=order,
                           sink=torch.zeros(1, device=dev, dtype=torch.int32),
                           weight_bytes=sum(lin[nm][i].weight.numel() * 2 for nm, i in order))


def step(s: SimpleNamespace, before=None) -> None:
    """The main stream's sequence; ``before(j)`` (optional) is called before projection j is enqueued."""
    x = s.h
    for j, (nm, i) in enumerate(s.order):
        if nm == "attn.c_proj":
            if s.kv:
                s.kv[i].amax()  # the attention stand-in: a read of the layer's KV
            x = x[:, : s.d].contiguous()  # the attention output's width
        if before is not None:
            before(j)
        x = cublaslt.torch_linear(x, s.lin[nm][i], nm == "c_fc")


def ahead(s: SimpleNamespace, dist: int, join: bool):
    """The step with projection j+dist's weights read on a side stream from when projection j is enqueued."""
    def run():
        main, side = torch.cuda.current_stream(), torch.cuda.Stream()
        ready = {}

        def fetch(j: int) -> None:
            if j >= len(s.order):
                return
            nm, i = s.order[j]
            side.wait_stream(main)  # from here on the main stream: the side's read overlaps projection j - dist
            with torch.cuda.stream(side):
                touch(s.lin[nm][i].weight, s.sink)
                ev = torch.cuda.Event()
                ev.record(side)
            ready[j] = ev

        def before(j: int) -> None:
            if j == 0:
                for first in range(dist):
                    fetch(first)
            if join and j in ready:
                main.wait_event(ready.pop(j))
            fetch(j + dist)

        step(s, before)
        main.wait_stream(side)  # the capture ends with the side stream joined
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="starcoderbase-1b", choices=sorted(set(SHAPES) - {"default"}))
    ap.add_argument("--rows", default="1,64,256")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--distances", default="1,2")
    ap.add_argument("--kv-mb", default="0,37.7", help="attention stand-in per layer, MB (37.7: B = 64, 1,152 tokens)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--hbm-tbs", type=float, default=4.1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), getattr(torch, args.dtype)
    rows = []
    for kv_mb in (float(v) for v in args.kv_mb.split(",")):
        for m in (int(r) for r in args.rows.split(",")):
            s = build(args.shape, m, args.layers, kv_mb, dev, dt)
            with torch.inference_mode():
                arms = {"base": lambda: step(s)}
                for dist in (int(v) for v in args.distances.split(",")):
                    arms[f"ahead {dist}"] = ahead(s, dist, True)
                    arms[f"ahead {dist} nojoin"] = ahead(s, dist, False)
                arms["stream"] = lambda: [touch(s.lin[nm][i].weight, s.sink) for nm, i in s.order]
                times = {name: graph_time(fn) for name, fn in arms.items()}
            base = times["base"]
            for name, t in times.items():
                row = {"shape": args.shape, "m": m, "kv_mb": kv_mb, "arm": name, "us": t * 1e6,
                       "vs_base": base / t, "weight_tbs": s.weight_bytes / t / 1e12}
                rows.append(row)
                print(f"M={m:4d} kv {kv_mb:5.1f} MB/layer {name:16s} {t * 1e6:8.1f} us  x{base / t:.3f} vs base  "
                      f"weights {row['weight_tbs']:.2f} TB/s ({row['weight_tbs'] / args.hbm_tbs:.0%})", flush=True)
            del s
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "l2_prefetch_bench.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(dev), "dtype": args.dtype, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
