"""Decode attention on the GPU: flashinfer's tensor-core decode (the worker's today) against the Triton
multi-query kernel of ``worker_svc/attention/mqa_decode.py``, per shape and batch.

Each candidate runs ``layers`` attention calls over distinct K/V pools (as a model's layers do, so K/V come from
HBM and not from L2) inside one CUDA graph; the time per call is the replay time over ``layers``. flashinfer is
planned once before its capture (the worker plans it before every step on the host: not counted here). The
Triton kernel's configuration is swept (KV splits around ``splits_for``, rows per loop step, warps, stages) and
the best kept. Printed per (shape, batch, slot layout): microseconds, the KV bytes over that time (TB/s) and its
fraction of ``--hbm-tbs`` (4.1 TB/s, the H200's measured device-to-device copy, ../shared/gpu/README.md), the
ratio of flashinfer's time to the best Triton one, and the largest difference between their outputs (bf16).
Slot layouts: ``contiguous`` (each request's KV in one run of slots, as a prefill allocates) and ``scattered``
(a random permutation: the worst case of a long-running pool).

    python -m bench.attn_bench --shapes starcoderbase-1b,tiny_starcoder_py --batches 1,64,256 --context 1152 --out DIR

Writes DIR/attn_bench.json. CUDA and flashinfer only.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from bench.gemm_bench import graph_time
from worker_svc.attention.mqa_decode import DecodeConfig, MQADecodeWorkspace, mqa_decode, splits_for
from worker_svc.model.default import SHAPES


WIDE_TILES = ((32, 4, 2), (32, 4, 3), (32, 4, 4), (64, 4, 2), (64, 4, 3), (64, 4, 4), (64, 8, 2), (64, 8, 3),
              (128, 8, 2))  # (KV rows a loop step, warps, stages) of --wide


def case(shape: str, batch: int, context: int, layout: str, layers: int, hbm: float, sms: int,
         wide: bool = False) -> dict:
    """One (shape, batch, slot layout): flashinfer's time and every swept Triton configuration's (us, TB/s, the
    largest difference from flashinfer's output), and the best of them. ``wide``: the ``--wide`` sweep."""
    import flashinfer
    from triton.runtime.errors import OutOfResources

    cfg = SHAPES[shape]
    H, D = cfg["n_head"], cfg["n_embd"] // cfg["n_head"]
    dev, dt = torch.device("cuda"), torch.bfloat16
    total = batch * context
    g = torch.Generator(device="cpu").manual_seed(batch + context)
    slots = (torch.arange(total) if layout == "contiguous" else torch.randperm(total, generator=g)) + 1
    indices = slots.to(torch.int32).to(dev)
    indptr = torch.arange(0, total + 1, context, dtype=torch.int32)
    pools = [(torch.randn(total + 1, 1, D, device=dev, dtype=dt), torch.randn(total + 1, 1, D, device=dev, dtype=dt))
             for _ in range(layers)]
    q = torch.randn(batch, H, D, device=dev, dtype=dt)
    scale = 1 / math.sqrt(D)
    kv_bytes = total * 2 * D * 2

    ws = torch.empty(1024 * 2**20, dtype=torch.uint8, device=dev)  # 15B at B = 256 needs 703 MB (run 11 call 5)
    fi = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws, "NHD", use_cuda_graph=True, use_tensor_cores=True, paged_kv_indptr_buffer=indptr.to(dev),
        paged_kv_indices_buffer=indices.clone(), paged_kv_last_page_len_buffer=torch.ones(batch, dtype=torch.int32, device=dev))
    fi.plan(indptr, indices, torch.ones(batch, dtype=torch.int32), H, 1, D, 1, q_data_type=dt, kv_data_type=dt,
            sm_scale=scale)
    fi_out = [torch.empty_like(q) for _ in range(layers)]

    def run_fi():
        for i, (k, v) in enumerate(pools):
            fi.run(q, (k.unsqueeze(1), v.unsqueeze(1)), out=fi_out[i])

    t_fi = graph_time(run_fi) / layers
    rec = {"shape": shape, "batch": batch, "context": context, "layout": layout, "kv_bytes": kv_bytes,
           "flashinfer_us": t_fi * 1e6, "flashinfer_tbs": kv_bytes / t_fi / 1e12, "triton": []}

    base = splits_for(batch, sms)
    if wide:  # every split count from a third to twice the rule's, more tile shapes and pipeline depths
        configs = {DecodeConfig(s, bn, w, st) for s in range(max(1, base // 3), min(128, base * 2) + 1)
                   for bn, w, st in WIDE_TILES}
    else:
        configs = {DecodeConfig(s, bn, w, st) for s in {max(1, base // 2), base, min(128, base * 2)}
                   for bn, w, st in ((32, 4, 2), (64, 4, 2), (64, 4, 3), (128, 8, 2))}
    tr_out = [torch.empty_like(q) for _ in range(layers)]
    indptr_dev = indptr.to(dev)
    best = None
    for c in sorted(configs, key=lambda c: (c.splits, c.block_n, c.warps, c.stages)):
        mws = MQADecodeWorkspace(batch, c.splits, H, D, dev) if c.splits > 1 else None

        def run_tr(c=c, mws=mws):
            for i, (k, v) in enumerate(pools):
                mqa_decode(q, k, v, indices, indptr_dev, scale, c, mws, out=tr_out[i])

        try:
            t = graph_time(run_tr) / layers
        except OutOfResources as exc:  # a configuration over the GPU's shared memory or registers: recorded, skipped
            rec["triton"].append({"config": c.__dict__, "error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        err = max((tr_out[i].float() - fi_out[i].float()).abs().max().item() for i in range(layers))
        rec["triton"].append({"config": c.__dict__, "us": t * 1e6, "tbs": kv_bytes / t / 1e12, "max_abs_diff": err})
        if best is None or t < best[0]:
            best = (t, c, err)
    if best is not None:
        t, c, err = best
        rec.update(best_us=t * 1e6, best_tbs=kv_bytes / t / 1e12, best_config=c.__dict__, best_max_abs_diff=err,
                   flashinfer_over_triton=t_fi / t)
        print(f"{shape:18s} B={batch:4d} ctx {context} {layout:10s}: flashinfer {t_fi * 1e6:7.1f} us "
              f"({kv_bytes / t_fi / 1e12:.2f} TB/s, {kv_bytes / t_fi / 1e12 / hbm:.0%})  triton {t * 1e6:7.1f} us "
              f"({kv_bytes / t / 1e12:.2f} TB/s, {kv_bytes / t / 1e12 / hbm:.0%}) {c}  flashinfer/triton "
              f"{t_fi / t:.2f}x  max|diff| {err:.3g}", flush=True)
    pools.clear()
    torch.cuda.empty_cache()
    return rec


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="starcoderbase-1b,tiny_starcoder_py")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--context", type=int, default=1152)
    ap.add_argument("--layouts", default="contiguous,scattered")
    ap.add_argument("--layers", type=int, default=24, help="distinct K/V pools per graph")
    ap.add_argument("--hbm-tbs", type=float, default=4.1)
    ap.add_argument("--wide", action="store_true", help="sweep every split count from a third to twice the rule's "
                    "(splits_for) and more tiles / stages (WIDE_TILES)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("attn_bench needs CUDA")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    t0 = time.time()
    results = [case(s, int(b), args.context, lay, args.layers, args.hbm_tbs, sms, args.wide)
               for s in args.shapes.split(",") for b in args.batches.split(",") for lay in args.layouts.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attn_bench.json").write_text(json.dumps({"device": torch.cuda.get_device_name(0), "sms": sms,
                                                         "seconds": time.time() - t0, "results": results}, indent=2))


if __name__ == "__main__":
    main()
