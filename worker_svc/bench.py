"""Forward-step benchmark of the worker engine (not a test: numbers, no assertions).

    python -m worker_svc.bench [--model-path DIR | --shape starcoderbase-1b] [--device cpu|cuda]
                               [--dtype float32|bfloat16|...] [--attention auto|torch|flashinfer]
                               [--batches 1,32,256] [--context 1024] [--prefill 96,1024] [--prefill-prefix 0]
                               [--extend-graph-max-tokens 1024] [--no-whole-graph] [--no-ragged-prefill]
                               [--json-out FILE]
                               [--decode-steps 8] [--profile DIR]

Cases: decode steps at each batch size with every request holding ``--context`` tokens, and one extend of
each ``--prefill`` size after ``--prefill-prefix`` cached tokens, eager, through the piecewise extend graphs
and through the whole extend graphs (``extend_whole_graph``, with the GPU time of their replay alone; ratios to
eager printed; an eager extend after no cached prefix takes flashinfer's ragged prefill unless
``--no-ragged-prefill``, and its line names the path). For decode it prints the fraction of the memory-bandwidth limit: (weight bytes + KV
bytes read per step) / step time, over the device-to-device copy bandwidth measured in the same run.
With ``--decode-steps K`` (> 1) it also times Forwards of K decode steps each (per-step time = Forward / K),
the same Forwards chained as the scheduler sends them (two in flight, ``after_seq``; with the step metadata built
while the Forward ahead runs, the worker's default, and at the launch, alternated twice: their ratio), and with CUDA graphs the
replay of the captured graph alone (CUDA events, no planning or host work: the GPU time of a step, the floor the
host-side preparation is measured against). ``--profile DIR`` writes a torch.profiler trace and an operator
table of one multi-step Forward at the largest batch.
The KV contents are random (timing does not depend on them); request state is set up with ``has_prefix``.
With ``--shape`` the random weights are generated on the device (nothing is written to disk).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

import torch

from worker_svc import bench_gemms
from worker_svc.build import (make_backend, make_extend_graphs, make_graphs, make_whole_graphs, resolve_device,
                              resolve_dtype)
from worker_svc.engine import Engine
from worker_svc.kv_pool import KVPool, geometry
from worker_svc.model.config import ModelConfig
from worker_svc.model.default import model_config, random_weights
from worker_svc.model.gpt_bigcode import GPTBigCodeForCausalLM
from worker_svc.model.loader import load_model
from worker_svc.sampler import SamplingParams
from worker_svc.types import ForwardItem


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t)
    return 2 * nbytes / min(times)


def random_model(shape: str, dtype: torch.dtype, device: torch.device) -> tuple[ModelConfig, GPTBigCodeForCausalLM]:
    cfg = ModelConfig.from_dict(model_config(shape, dtype=str(dtype).removeprefix("torch.")))
    with torch.device("meta"):
        model = GPTBigCodeForCausalLM(cfg)
    model = model.to(dtype=dtype).to_empty(device=device)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in random_weights(model_config(shape), seed=0, dtype=dtype, device=str(device)):
            params[name].copy_(t)
    return cfg, model.eval()


def time_steps(fn, device: torch.device, warmup: int, iters: int) -> float:
    """Median seconds of ``fn()``."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def replay_seconds(graph, device: torch.device, iters: int = 20) -> float:
    """Median GPU seconds of one replay of a captured graph (CUDA events), with the last plan in place."""
    graph.replay()
    sync(device)
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


CHAINED_WARMUP = 2


def chained_seconds(eng: Engine, reqs: list, slot, k: int, warmup: int, forwards: int,
                    sampling: SamplingParams = SamplingParams()) -> float:
    """Seconds a Forward of ``k`` decode steps takes when Forwards are sent as the scheduler's overlapped decode
    sends them: ``input_from_last_sample`` items, Forward s+1 (``after_seq`` s) sent while s runs, at most two
    in flight (two server threads). ``reqs``: [request id, slot list, token list] each, extended in place;
    ``slot``: an iterator of free slots; ``sampling``: every row's parameters (greedy by default)."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    seq0 = getattr(eng, "_bench_seq", 0)

    def items():
        out = []
        for rid, slots, toks in reqs:
            new = [next(slot) for _ in range(k)]
            out.append(ForwardItem(request_id=rid, input_ids=(), position_start=len(slots), slot_ids=tuple(new),
                                   decode_steps=k, input_from_last_sample=True, sampling=sampling))
            slots.extend(new)
            toks.extend([0] * k)
        return out

    def run(n: int, first_seq: int) -> None:
        in_flight: deque = deque()
        with ThreadPoolExecutor(max_workers=2) as pool:
            for i in range(n):
                seq = first_seq + i
                in_flight.append(pool.submit(eng.forward, items(), eng.epoch, seq=seq, after_seq=seq - 1 if i else 0))
                if len(in_flight) == 2:
                    in_flight.popleft().result()
            for f in in_flight:
                f.result()

    run(warmup, seq0 + 1)
    sync(eng.device)
    t0 = time.perf_counter()
    run(forwards, seq0 + 1 + warmup)
    sync(eng.device)
    eng._bench_seq = seq0 + warmup + forwards
    return (time.perf_counter() - t0) / forwards


def profile_forward(fn, device: torch.device, out_dir: str, batch: int | str) -> None:
    """Writes ``trace-b{batch}.json`` (chrome trace) and ``ops-b{batch}.txt`` (operator table, CPU and CUDA
    time) of one call of ``fn`` under torch.profiler into ``out_dir``."""
    import os

    from torch.profiler import ProfilerActivity, profile

    os.makedirs(out_dir, exist_ok=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
        sync(device)
    prof.export_chrome_trace(os.path.join(out_dir, f"trace-b{batch}.json"))
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    with open(os.path.join(out_dir, f"ops-b{batch}.txt"), "w") as f:
        f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
        f.write("\n\n")
        f.write(prof.key_averages().table(sort_by=key, row_limit=40))


def force_decode_config(**fields) -> None:
    """Every Triton decode bucket built from now on takes ``fields`` (``mqa_decode.DecodeConfig``'s: splits,
    block_n, stages, warps) over ``decode_config``'s choice, the rest of it kept:
    the bench's in-graph sweep of what ``attn_bench`` sweeps alone."""
    from dataclasses import replace

    from worker_svc.attention import triton_decode

    chosen = triton_decode.decode_config
    triton_decode.decode_config = lambda batch, sms, head_dim: replace(chosen(batch, sms, head_dim), **fields)


def run_overlap(graph, model, pool, cfg, args, device: torch.device, results: list) -> None:
    """``--overlap-prefill``: the decode graph beside a captured prefill (``bench_overlap``); prints and records."""
    from worker_svc.bench_overlap import capture, overlap, prefill_stand_in

    n = args.overlap_prefill // args.overlap_seq_len
    ids = torch.randint(1, cfg.vocab_size, (n, args.overlap_seq_len), generator=torch.Generator().manual_seed(1))
    prefill = capture(prefill_stand_in(model, pool, ids.to(device), first_slot=pool.pool_slots - args.overlap_prefill),
                      device)
    for k in (int(x) for x in args.overlap_decode_replays.split(",")):
        r = overlap(graph, prefill, k, 1, device)
        results.append({"case": "overlap", "prefill_tokens": args.overlap_prefill, "seq_len": args.overlap_seq_len, **r})
        print(f"    overlap: {k} decode steps ({r['decode_alone_ms']:.2f} ms alone) beside a {args.overlap_prefill}-token "
              f"prefill ({r['prefill_alone_ms']:.2f} ms alone): one after the other {r['serial']['makespan_ms']:.2f} ms; "
              + "; ".join(f"{m} {r[m]['makespan_ms']:.2f} (decode done at {r[m]['decode_ms']:.2f}, prefill at "
                          f"{r[m]['prefill_ms']:.2f})" for m in ("concurrent", "decode_priority"))
              + f"; serial / best = {r['gain']:.3f}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path")
    ap.add_argument("--shape", help="random weights of a real shape (see worker_svc.model.default.SHAPES)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--attention", default="auto")
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--prefill", default="1024", help="extend sizes in tokens, comma-separated")
    ap.add_argument("--attn-splits", type=int, default=0,
                    help="KV splits a request of the Triton decode attention's graph buckets (0: decode_config's "
                         "choice; the in-graph sweep of the split count)")
    ap.add_argument("--attn-block-n", type=int, default=0, help="... KV rows a loop step (0: decode_config's)")
    ap.add_argument("--attn-stages", type=int, default=0, help="... pipeline stages (0: decode_config's)")
    ap.add_argument("--attn-warps", type=int, default=0, help="... warps a CTA (0: decode_config's)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="the decode rows' sampling temperature (0: greedy; > 0: the draw with top_k 50, as a "
                         "sampling workload runs it)")
    ap.add_argument("--prefill-prefix", type=int, default=0, help="cached tokens before each extend")
    ap.add_argument("--extend-graph-max-tokens", type=int, default=1024,
                    help="piecewise extend graphs up to this many tokens (0 = eager extends only)")
    ap.add_argument("--whole-graph", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the one-request extends through whole extend graphs up to "
                         "--extend-graph-max-tokens (flashinfer only)")
    ap.add_argument("--ragged-prefill", action=argparse.BooleanOptionalAction, default=True,
                    help="eager extends without a cached prefix through flashinfer's ragged prefill (the worker's "
                         "--ragged-prefill; --no-ragged-prefill: the paged prefill, for the A/B)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--cuda-graph-max-batch", type=int, default=256, help="0 = eager decode")
    ap.add_argument("--decode-steps", type=int, default=1)
    ap.add_argument("--fused", choices=("none", "norms", "gelu", "all"), default="all",
                    help="fused kernels (model.fused): none, residual add + LayerNorm, that and the GELU epilogue, "
                         "or those and the K/V write with a strided q (all, as served)")
    ap.add_argument("--profile")
    ap.add_argument("--ncu", action="store_true",
                    help="one graph replay at the largest batch between cudaProfilerStart/Stop, for "
                         "`ncu --profile-from-start off --graph-profiling node` (per-kernel hardware counters)")
    ap.add_argument("--blas", choices=("default", "cublas", "cublaslt"), default="default",
                    help="torch.backends.cuda.preferred_blas_library for the GEMMs (issue 15 technique 2)")
    ap.add_argument("--decode-attention", default="auto", choices=["auto", "flashinfer", "triton"],
                    help="the decode graphs' attention (worker_svc/cuda_graph.DecodeGraphs); auto: the worker's "
                         "default (build.triton_decode_max_batch)")
    ap.add_argument("--extend-attention", default="auto", choices=["auto", "fa2", "fa3"],
                    help="flashinfer's paged prefill in the whole extend graphs (the worker's --extend-attention)")
    ap.add_argument("--pdl", action=argparse.BooleanOptionalAction, default=True,
                    help="the Triton kernels as programmatic dependent launches (on, as the worker runs them)")
    bench_gemms.add_args(ap)
    ap.add_argument("--overlap-prefill", type=int, default=0,
                    help="after the largest decode batch's graph: that decode graph and a prefill of this many tokens "
                         "(worker_svc/bench_overlap.py) on two CUDA streams at once against one after the other "
                         "(0: off; CUDA graphs only)")
    ap.add_argument("--overlap-seq-len", type=int, default=1024, help="... the prefill's prompt length")
    ap.add_argument("--overlap-decode-replays", default="8,24,48",
                    help="... decode steps (graph replays) beside one prefill, comma-separated")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    if args.overlap_prefill < 0 or (args.overlap_prefill and (
            args.overlap_seq_len <= 0 or args.overlap_prefill % args.overlap_seq_len)):
        ap.error(f"--overlap-prefill ({args.overlap_prefill}) must be 0 or a positive multiple of --overlap-seq-len "
                 f"({args.overlap_seq_len})")
    if args.overlap_prefill and (args.decode_steps < 2 or max(int(b) for b in args.batches.split(","))
                                 > args.cuda_graph_max_batch):
        ap.error("--overlap-prefill runs beside the largest batch's decode graph: it needs --decode-steps > 1 and "
                 "--batches within --cuda-graph-max-batch (CUDA)")
    if args.temperature < 0:
        ap.error(f"--temperature must be >= 0 (got {args.temperature})")
    sampling = SamplingParams(temperature=args.temperature, top_k=50) if args.temperature > 0 else SamplingParams()
    if min(args.attn_splits, args.attn_stages, args.attn_warps) < 0 or (args.attn_block_n and (args.attn_block_n < 16 or
                                                                               args.attn_block_n & (args.attn_block_n - 1))):
        ap.error("--attn-splits, --attn-stages and --attn-warps must be >= 0, --attn-block-n 0 or a power of two >= 16 "
                 "(tl.dot)")
    forced = {k: v for k, v in (("splits", args.attn_splits), ("block_n", args.attn_block_n),
                                ("stages", args.attn_stages), ("warps", args.attn_warps)) if v}
    if forced:
        force_decode_config(**forced)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    if args.blas != "default":
        torch.backends.cuda.preferred_blas_library(args.blas)
    if args.shape:
        cfg, model = random_model(args.shape, dtype, device)
    else:
        if not args.model_path:
            from worker_svc.model.default import ensure_default_model
            args.model_path = str(ensure_default_model())
        cfg, model = load_model(args.model_path, dtype=dtype, device=device)
    bench_gemms.set_up(ap, args, cfg, model)
    batches = [int(b) for b in args.batches.split(",")]
    ctx = args.context
    chained_calls = 4 * (CHAINED_WARMUP + max(4, args.iters))  # ahead / at launch, alternated twice
    multi_calls = max(3, args.iters // 2) + 2 + chained_calls if args.decode_steps > 1 else 0  # warm-up, timed, profile
    prefills = [int(n) for n in args.prefill.split(",") if n]
    # the overlap's prefill writes the pool's last slots, after every decode request's
    kv_tokens = (max(batches) * (ctx + args.iters + 8 + multi_calls * args.decode_steps) + args.prefill_prefix
                 + max(prefills, default=0) + args.overlap_prefill + 16)
    pool = KVPool(cfg, geometry(cfg, dtype, kv_tokens=kv_tokens), dtype, device)
    for t in pool.k + pool.v:
        t.normal_()
    whole_tokens = args.extend_graph_max_tokens if args.whole_graph else 0
    backend = make_backend(args.attention, cfg, dtype, device, args.cuda_graph_max_batch, whole_tokens)
    eng = Engine(cfg, model, pool, backend, epoch=uuid.uuid4().hex, ragged_prefill=args.ragged_prefill)
    eng.warmup()
    eng.graphs = make_graphs(args.cuda_graph_max_batch, cfg, model, pool, backend, args.decode_attention)
    if args.overlap_prefill and eng.graphs is None:
        ap.error("--overlap-prefill needs the decode graphs (CUDA)")
    eng.extend_graphs = make_extend_graphs(args.extend_graph_max_tokens, model, pool, backend)
    # on for the prefill cases' "whole" mode
    whole = make_whole_graphs(whole_tokens, cfg, model, pool, backend, args.extend_attention)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    embeddings = (model.transformer.wte.weight, model.transformer.wpe.weight)
    layer_params = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in embeddings)
    bw = copy_bandwidth(device, 1 << 30 if device.type == "cuda" else 1 << 27)
    results = []
    print(f"# model {cfg.name} ({weight_bytes / 1e9:.2f} GB weights) dtype {str(dtype)[6:]} device {device} "
          f"attention {backend.name} ragged prefill {eng.ragged_prefill} cuda graphs {eng.graphs is not None} fused norms {model.fuse_norms} gelu epilogue {model.gelu_epilogue} kv write {model.fuse_kv}; copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    g = torch.Generator().manual_seed(0)
    for b in batches:
        eng.requests.clear()
        slot = iter(range(1, pool.pool_slots))
        reqs = []
        for i in range(b):
            prefix = [next(slot) for _ in range(ctx - 1)]
            toks = torch.randint(1, cfg.vocab_size, (ctx,), generator=g).tolist()
            reqs.append([f"r{i}", prefix, toks])
        # the first step registers every request (has_prefix), then decode steps follow
        state = {"first": True}

        def step():
            items = []
            for rid, slots, toks in reqs:
                new = next(slot)
                if state["first"]:
                    items.append(ForwardItem(request_id=rid, input_ids=(toks[-1],), position_start=len(slots),
                                             slot_ids=(new,), has_prefix=True, prefix_slot_ids=tuple(slots),
                                             prefix_token_ids=tuple(toks[:len(slots)]), sampling=sampling))
                else:
                    items.append(ForwardItem(request_id=rid, input_ids=(toks[-1],), position_start=len(slots),
                                             slot_ids=(new,), sampling=sampling))
                slots.append(new)
                toks.append(toks[-1])
            state["first"] = False
            eng.forward(items, eng.epoch)

        step()
        secs = time_steps(step, device, warmup=1, iters=args.iters)
        kv_read = b * (ctx + args.iters) * cfg.kv_bytes_per_token(pool.k[0].element_size())
        frac = (weight_bytes + kv_read) / secs / bw
        rec = {"case": "decode", "batch": b, "context": ctx, "step_ms": secs * 1e3, "tokens_per_s": b / secs,
               "bytes_per_step": weight_bytes + kv_read, "bandwidth_fraction": frac}
        results.append(rec)
        print(f"decode batch {b:4d} ctx {ctx}: {secs * 1e3:8.2f} ms/step  {b / secs:10.1f} tok/s  "
              f"{frac * 100:5.1f}% of copy bandwidth", flush=True)
        if args.decode_steps > 1:
            k = args.decode_steps

            def multi():
                items = []
                for rid, slots, toks in reqs:
                    new = [next(slot) for _ in range(k)]
                    items.append(ForwardItem(request_id=rid, input_ids=(toks[-1],), position_start=len(slots),
                                             slot_ids=tuple(new), decode_steps=k, sampling=sampling))
                    slots.extend(new)
                    toks.extend([toks[-1]] * k)
                return eng.forward(items, eng.epoch)

            msecs = time_steps(multi, device, warmup=1, iters=max(3, args.iters // 2)) / k
            mfrac = (weight_bytes + kv_read) / msecs / bw
            rec = {"case": "decode_multistep", "batch": b, "context": ctx, "decode_steps": k, "step_ms": msecs * 1e3,
                   "tokens_per_s": b / msecs, "bandwidth_fraction": mfrac}
            print(f"decode batch {b:4d} ctx {ctx} K={k}: {msecs * 1e3:8.2f} ms/step  {b / msecs:10.1f} tok/s  "
                  f"{mfrac * 100:5.1f}% of copy bandwidth", flush=True)
            if eng.graphs is not None and b <= eng.graphs.max_batch:
                graph = eng.graphs.graphs[eng.graphs.bucket(b)][0]
                rsecs = replay_seconds(graph, device)
                rec["graph_replay_ms"] = rsecs * 1e3
                rec["replay_bandwidth_fraction"] = (weight_bytes + kv_read) / rsecs / bw
                print(f"    graph replay alone (GPU time of a step): {rsecs * 1e3:8.2f} ms  "
                      f"{rec['replay_bandwidth_fraction'] * 100:5.1f}% of copy bandwidth; host/GPU = {msecs / rsecs:.2f}",
                      flush=True)
                if args.overlap_prefill and b == max(batches):
                    run_overlap(graph, model, pool, cfg, args, device, results)
                if args.ncu and b == max(batches):
                    torch.cuda.cudart().cudaProfilerStart()
                    graph.replay()
                    sync(device)
                    torch.cuda.cudart().cudaProfilerStop()
            results.append(rec)
            # the same Forwards, sent as the scheduler sends them (two in flight), launched behind the Forward ahead
            # on the device (the worker's default) and at their turn (--no-launch-behind), alternated twice; the
            # step metadata built ahead in both (run 13 measured that)
            chained, configured = {True: [], False: []}, eng.launch_behind
            behind0 = eng.prepared_ahead["behind"]
            for behind in (False, True, False, True):
                eng.launch_behind = behind
                chained[behind].append(chained_seconds(eng, reqs, slot, k, CHAINED_WARMUP, max(4, args.iters),
                                                      sampling) / k)
            launched = eng.prepared_ahead["behind"] - behind0
            for behind, secs in chained.items():
                csecs = min(secs)
                results.append({"case": "decode_chained", "batch": b, "context": ctx, "decode_steps": k,
                                "launch_behind": behind, "step_ms": csecs * 1e3, "tokens_per_s": b / csecs,
                                "step_ms_runs": [x * 1e3 for x in secs], "launched_behind": launched})
                print(f"decode batch {b:4d} ctx {ctx} K={k} chained ({'launched behind' if behind else 'at its turn'}): "
                      f"{csecs * 1e3:8.2f} ms/step  {b / csecs:10.1f} tok/s", flush=True)
            on, off = min(chained[True]), min(chained[False])
            print(f"decode batch {b:4d} chained: launched behind / at its turn = {on / off:.3f} ({launched} Forwards "
                  f"launched behind, in the runs with it on)", flush=True)
            eng.launch_behind = configured
            if args.profile and b == max(batches):
                profile_forward(multi, device, args.profile, b)
    eng.requests.clear()
    graphs, pre = eng.extend_graphs, args.prefill_prefix
    for n in prefills:
        toks = torch.randint(1, cfg.vocab_size, (pre + n,), generator=g).tolist()
        slots = tuple(range(1, pre + n + 1))

        device_s: list[float] = []  # each extend's device span of its layers (ForwardResult.device_seconds)
        def prefill():
            res = eng.forward([ForwardItem(request_id="p", input_ids=tuple(toks[pre:]), position_start=pre,
                                           slot_ids=slots[pre:], has_prefix=True, prefix_slot_ids=slots[:pre],
                                           prefix_token_ids=tuple(toks[:pre]))], eng.epoch)
            device_s.append(res.device_seconds)
            eng.release(["p"])

        # the same extend eager, through the piecewise graphs and through the whole graphs (where they fit), back
        # to back: (mode, piecewise graphs, whole graphs)
        modes = [("eager", None, None)] + ([("graphs", graphs, None)] if graphs is not None and n <= graphs.max_tokens
                                           else []) + ([("whole", graphs, whole)] if whole is not None and
                                                       n <= whole.max_tokens else [])
        timed = {}
        for mode, g_ext, g_whole in modes:
            eng.extend_graphs, eng.whole_graphs = g_ext, g_whole
            device_s.clear()
            timed[mode] = secs = time_steps(prefill, device, warmup=1, iters=max(3, args.iters // 2))
            flops = 2 * (weight_bytes / pool.k[0].element_size()) * n
            # what the GPU computes: the layers' GEMMs (2 * non-embedding params * tokens; the lm_head runs on the
            # sampled row alone) and causal attention (QK^T and PV: 4 * n_embd per visible query-key pair and layer)
            work = 2 * layer_params * n + 4 * cfg.n_layer * cfg.n_embd * (n * pre + n * (n + 1) // 2)
            path = "ragged" if mode == "eager" and pre == 0 and eng.ragged_prefill else "paged"
            rec = {"case": "prefill", "tokens": n, "prefix": pre, "mode": mode, "attention_path": path,
                   "step_ms": secs * 1e3, "tokens_per_s": n / secs, "approx_tflops": flops / secs / 1e12,
                   "tflops_layers_and_attention": work / secs / 1e12}
            results.append(rec)
            print(f"prefill {n} tokens after {pre} ({mode}, {path} attention): {secs * 1e3:8.2f} ms  "
                  f"{n / secs:10.1f} tok/s  ~{flops / secs / 1e12:.1f} TFLOP/s (2 * params * tokens), "
                  f"{work / secs / 1e12:.1f} (layers' GEMMs + causal attention)"
                  + (f"  {timed['eager'] / secs:.2f}x eager" if mode != "eager" else ""), flush=True)
            if mode == "eager" and device.type == "cuda":  # the layers' GPU span, host plan and read-back outside it
                dsecs = statistics.median(device_s[1:])  # the timed runs (the first was the warm-up)
                rec["device_ms"], rec["device_tflops_layers_and_attention"] = dsecs * 1e3, work / dsecs / 1e12
                print(f"    device span of the layers (GPU time of the extend, StepClock): {dsecs * 1e3:8.2f} ms  "
                      f"{work / dsecs / 1e12:.1f} TFLOP/s (layers' GEMMs + causal attention); host/GPU = "
                      f"{secs / dsecs:.2f}", flush=True)
            if g_whole is not None:  # the last prefill's plan is in place: its lengths
                rsecs = replay_seconds(g_whole.graphs[g_whole.bucket(n)], device)
                rec["graph_replay_ms"] = rsecs * 1e3
                print(f"    whole graph replay alone (GPU time of the extend): {rsecs * 1e3:8.2f} ms; "
                      f"host/GPU = {secs / rsecs:.2f}", flush=True)
            if args.profile:  # where an extend's host time goes (ops-prefill<N>-<mode>.txt, trace-...json)
                profile_forward(prefill, device, args.profile, f"prefill{n}-{mode}")
        eng.extend_graphs, eng.whole_graphs = graphs, None
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"model": cfg.name, "dtype": str(dtype), "device": str(device), "attention": backend.name,
                       "cuda_graphs": eng.graphs is not None, "extend_graphs_max_tokens": args.extend_graph_max_tokens
                       if eng.extend_graphs is not None else 0,
                       "whole_graph_max_tokens": whole_tokens if whole is not None else 0,
                       "ragged_prefill": eng.ragged_prefill, "fused": args.fused, "splitk_rows": args.splitk_rows, "resident_rows": args.resident_rows, "resident_stream": args.resident_stream, "resident_mm_rows": args.resident_mm_rows, "resident_mm_shape": list(model.mm.mm_shape) if model.mm is not None else None, "splitk_only": args.splitk_only, "temperature": args.temperature, "attn_forced": forced,
                       "pdl": model.pdl, "prefetch_blocks": args.prefetch_blocks, "decode_attention": eng.attention_name(),
                       "fuse_norms": model.fuse_norms, "gelu_epilogue": model.gelu_epilogue, "fuse_kv": model.fuse_kv, "copy_bandwidth_bytes_per_s": bw, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
