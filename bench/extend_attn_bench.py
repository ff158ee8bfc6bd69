"""Extend attention over a cached prefix on the GPU: flashinfer's paged prefill with its SM90 backend (``fa3``, what
``auto`` picks on the H200 and what the worker's whole extend graphs run today) against its ``fa2`` backend, which
in CUDA-graph mode always splits the KV over CTAs (flashinfer 0.6.4, attention/scheduler.cuh
``PrefillSplitQOKVIndptr``: the grid is padded to the GPU's CTA slots and the KV cut into chunks to fill them).

Why: the editor's extend (about 100 new tokens after a cached prefix of about 1,700, one request) is one q tile per
KV head for a multi-query model (GPTBigCode: one K/V head), so a backend that does not split the KV runs a handful
of CTAs over the whole prefix (H200 run 14 call 1: 30 us a layer, 0.6 of the extend's 1.3 ms on the GPU, tiny).

Each case runs ``layers`` attention calls over distinct K/V pools (as the layers of a model do) inside one CUDA graph,
planned once before capture as ``worker_svc/extend_whole_graph.py`` does (``use_cuda_graph=True``, page size 1);
the time per call is the replay time over ``layers``. Printed per (shape, new tokens, prefix): microseconds for each
backend, the ratio fa3 / fa2, the host time of one ``plan`` each, and the largest difference between their outputs.

    python -m bench.extend_attn_bench --shapes tiny_starcoder_py,starcoderbase-1b,starcoder --new 16,128,512 \
        --prefix 0,1700 --out DIR

Writes DIR/extend_attn_bench.json. CUDA and flashinfer only.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from bench.gemm_bench import graph_time
from worker_svc.attention.workspace import workspace_bytes
from worker_svc.model.default import SHAPES


def case(shape: str, new: int, prefix: int, layers: int, backends: list[str]) -> dict:
    """One (shape, new tokens, cached prefix): per backend the us per layer call, the host us of one plan, and each
    backend's largest absolute difference from the first backend's output (bf16)."""
    import flashinfer

    cfg = SHAPES[shape]
    H, D = cfg["n_head"], cfg["n_embd"] // cfg["n_head"]
    dev, dt = torch.device("cuda"), torch.bfloat16
    kv = prefix + new
    g = torch.Generator(device="cpu").manual_seed(new + prefix)
    indices = (torch.randperm(kv, generator=g) + 1).to(torch.int32)  # a long-running pool's scattered slots
    pools = [(torch.randn(kv + 1, 1, D, device=dev, dtype=dt), torch.randn(kv + 1, 1, D, device=dev, dtype=dt))
             for _ in range(layers)]
    q = torch.randn(new, H, D, device=dev, dtype=dt)
    qo_indptr = torch.tensor([0, new], dtype=torch.int32)
    kv_indptr = torch.tensor([0, kv], dtype=torch.int32)
    last = torch.ones(1, dtype=torch.int32)
    i32 = dict(dtype=torch.int32, device=dev)
    props = torch.cuda.get_device_properties(dev)  # fa2 splits the KV in graph mode: its temporaries sized as the worker's
    ws = torch.empty(workspace_bytes(H, 1, D, props.multi_processor_count, (), props.major, [new]), dtype=torch.uint8,
                     device=dev)
    rec = {"shape": shape, "new": new, "prefix": prefix, "heads": H, "head_dim": D, "layers": layers, "backends": {}}
    ref = None
    for backend in backends:
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            ws, "NHD", use_cuda_graph=True, qo_indptr_buf=torch.zeros(2, **i32), paged_kv_indptr_buf=torch.zeros(2, **i32),
            paged_kv_indices_buf=torch.zeros(kv, **i32), paged_kv_last_page_len_buf=torch.ones(1, **i32),
            backend=backend)

        def plan():
            w.plan(qo_indptr, kv_indptr, indices.to(dev), last, H, 1, D, 1, causal=True, q_data_type=dt,
                   kv_data_type=dt, sm_scale=1 / math.sqrt(D))

        plan()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            plan()
        plan_us = (time.perf_counter() - t0) / 10 * 1e6
        torch.cuda.synchronize()
        outs = [torch.empty_like(q) for _ in range(layers)]

        def run(w=w, outs=outs):
            for i, (k, v) in enumerate(pools):
                w.run(q, (k.unsqueeze(1), v.unsqueeze(1)), out=outs[i])

        t = graph_time(run) / layers
        if ref is None:
            ref = outs
        err = max((outs[i].float() - ref[i].float()).abs().max().item() for i in range(layers))
        rec["backends"][backend] = {"us": t * 1e6, "plan_us": plan_us, "max_abs_diff_from_first": err}
    b = rec["backends"]
    line = "  ".join(f"{k} {v['us']:7.1f} us (plan {v['plan_us']:5.0f} us, |diff| {v['max_abs_diff_from_first']:.3g})"
                     for k, v in b.items())
    ratio = b[backends[0]]["us"] / b[backends[-1]]["us"]
    rec["first_over_last"] = ratio
    print(f"{shape:18s} new {new:5d} prefix {prefix:5d}: {line}  {backends[0]}/{backends[-1]} {ratio:.2f}x", flush=True)
    pools.clear()
    torch.cuda.empty_cache()
    return rec


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="tiny_starcoder_py,starcoderbase-1b,starcoder")
    ap.add_argument("--new", default="16,128,512,1024", help="new tokens of the one request, comma-separated")
    ap.add_argument("--prefix", default="0,1700", help="cached tokens before them, comma-separated")
    ap.add_argument("--backends", default="fa3,fa2", help="flashinfer backends; the ratio is first / last")
    ap.add_argument("--layers", type=int, default=20, help="distinct K/V pools per graph")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    backends = args.backends.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    recs = []
    for s in args.shapes.split(","):
        for p in map(int, args.prefix.split(",")):
            for n in map(int, args.new.split(",")):
                recs.append(case(s, n, p, args.layers, backends))
                (args.out / "extend_attn_bench.json").write_text(json.dumps(  # after each case: a crash keeps the rest
                    {"device": torch.cuda.get_device_name(), "cases": recs}, indent=1))


if __name__ == "__main__":
    main()
