"""Decode and prefill on two CUDA streams at once: does the device run them side by side (an experiment, issue 15).

At c64 the 1B's device time is decode steps (memory-bound: B = 64 GEMMs of 64-72 CTAs leave half the SMs idle,
the attention reads KV at ~1.5 TB/s) and extends (compute-bound GEMMs at ~570 TFLOP/s), one after the other on
one stream (H100 run 24: decode 1,029 ms, extends 477 ms, idle 75 ms of a c64 phase). If the two kinds of work
overlapped on the device, a phase would take less than their sum. ``overlap`` measures that with real kernels:
the decode graph the worker replays (one step, replayed ``n`` times) and a prefill stand-in (``prefill_stand_in``:
the model's own pieces, with causal attention over equal-length sequences through torch's SDPA where the worker
runs flashinfer's ragged prefill) captured as a graph; each alone, one after the other, and launched on two
streams at once (equal priority, and the decode stream at high priority). The GPU time of each is read from CUDA
events. `python -m worker_svc.bench --shape starcoderbase-1b --batches 64 --decode-steps 8 --overlap-prefill 8192` runs
it after the largest decode batch (CUDA graphs; the prefill writes the pool's last slots, after the decode requests').
"""

from __future__ import annotations

import statistics
from typing import Callable

import torch
import torch.nn.functional as F

from worker_svc.model.gpt_bigcode import GPTBigCodeForCausalLM


def prefill_stand_in(model: GPTBigCodeForCausalLM, kv_pool, ids: torch.Tensor,
                     first_slot: int = 1) -> Callable[[], torch.Tensor]:
    """A function running the extend of ``ids`` (int64 [n, seq_len]: n prompts of seq_len tokens each, no cached
    prefix, on the model's device) through the model's pieces (``GPTBigCodeForCausalLM.piece``: the same GEMMs,
    fused norms and K/V writes into ``kv_pool`` at slots first_slot .. first_slot + n * seq_len - 1) with causal
    attention by ``F.scaled_dot_product_attention`` per prompt. The function returns hidden states after ln_f
    [n * seq_len, n_embd] (model dtype); its inputs are fixed, so it can be captured in a CUDA graph. Raises
    ValueError if a prompt exceeds n_positions, or if those slots are not all in the pool (slot 0 excluded: the
    padding rows' slot)."""
    cfg = model.cfg
    n, seq_len = ids.shape
    tokens = n * seq_len
    if seq_len > cfg.n_positions:
        raise ValueError(f"prefill stand-in: prompts of {seq_len} tokens exceed n_positions {cfg.n_positions}")
    if first_slot < 1 or first_slot + tokens > kv_pool.pool_slots:
        raise ValueError(f"prefill stand-in: slots {first_slot}..{first_slot + tokens - 1} are not all in a pool "
                         f"of {kv_pool.pool_slots} slots (slot 0 is the padding rows')")
    device = ids.device
    flat = ids.reshape(-1)
    pos = torch.arange(seq_len, device=device).repeat(n)
    slots = torch.arange(first_slot, first_slot + tokens, device=device)
    scale = 1.0 / cfg.head_dim ** 0.5 if cfg.scale_attn_weights else 1.0

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q [T, n_head, d], k / v [T, kv_heads, d] -> [T, n_head, d]; prompts of seq_len, causal within each
        qs = q.view(n, seq_len, cfg.n_head, -1).transpose(1, 2)
        ks, vs = (t.view(n, seq_len, cfg.kv_heads, -1).transpose(1, 2) for t in (k, v))
        rep = cfg.n_head // cfg.kv_heads
        ks, vs = (t.repeat_interleave(rep, dim=1) if rep > 1 else t for t in (ks, vs))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
        return o.transpose(1, 2).reshape(tokens, cfg.n_head, -1)

    @torch.inference_mode()
    def run() -> torch.Tensor:
        h, q, kv = model.piece(0, kv_pool, slots, input_ids=flat, positions=pos)
        for i in range(cfg.n_layer):
            h, q, kv = model.piece(i + 1, kv_pool, slots, h=h, o=attend(q, *kv))
        return q

    return run


def capture(fn: Callable[[], object], device: torch.device) -> torch.cuda.CUDAGraph:
    """``fn`` captured as a CUDA graph (after two eager warm-up calls on a side stream, as torch asks), on a capture
    stream of its own: torch keys cuBLAS workspaces by stream, so a graph captured on torch's shared capture stream
    (as the worker's decode graphs are) would share their workspace, which two graphs running at once must not."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream(device)):
        fn()
    torch.cuda.synchronize(device)
    return graph


HOLD_CYCLES = 20_000_000  # GPU clock cycles (~10 ms at ~2 GHz): longer than queueing 50 graph replays


def _timed(decode: torch.cuda.CUDAGraph, n_decode: int, prefill: torch.cuda.CUDAGraph, n_prefill: int,
           mode: str, device: torch.device) -> tuple[float, float, float]:
    """One measurement: (ms until the decode replays end, ms until the prefill replays end, makespan ms), each
    from a common start event. ``mode``: "serial" (decode, then prefill, one stream), "concurrent" (two streams of
    equal priority), "decode_priority" (the decode stream at the highest priority)."""
    cur = torch.cuda.current_stream(device)
    # a lower number is a higher priority; torch maps one beyond the device's range to its highest
    sd = torch.cuda.Stream(device, priority=-100 if mode == "decode_priority" else 0)
    sp = torch.cuda.Stream(device, priority=0)
    start, end_d, end_p = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    # the device waits (~10 ms) while the host queues every replay, so the clock starts with all work queued
    torch.cuda._sleep(HOLD_CYCLES)
    start.record(cur)
    sd.wait_event(start)
    with torch.cuda.stream(sd):
        for _ in range(n_decode):
            decode.replay()
        end_d.record(sd)
    sp.wait_event(end_d if mode == "serial" else start)
    with torch.cuda.stream(sp):
        for _ in range(n_prefill):
            prefill.replay()
        end_p.record(sp)
    torch.cuda.synchronize(device)
    d, p = start.elapsed_time(end_d), start.elapsed_time(end_p)
    return d, p, max(d, p)


def overlap(decode: torch.cuda.CUDAGraph, prefill: torch.cuda.CUDAGraph, n_decode: int, n_prefill: int,
            device: torch.device, iters: int = 5) -> dict:
    """Medians over ``iters`` of each mode (``_timed``), interleaved, plus each part alone: {"decode_alone_ms",
    "prefill_alone_ms", "<mode>": {"decode_ms", "prefill_ms", "makespan_ms"}, "gain": serial makespan / the best
    concurrent makespan}. ms are GPU milliseconds (CUDA events)."""
    modes = ("serial", "concurrent", "decode_priority")
    runs: dict[str, list] = {m: [] for m in modes}
    alone_d, alone_p = [], []
    for m in modes:  # warm-up of every stream configuration
        _timed(decode, n_decode, prefill, n_prefill, m, device)
    for _ in range(iters):
        alone_d.append(_timed(decode, n_decode, prefill, 0, "serial", device)[0])
        alone_p.append(_timed(decode, 0, prefill, n_prefill, "serial", device)[1])
        for m in modes:
            runs[m].append(_timed(decode, n_decode, prefill, n_prefill, m, device))
    out: dict = {"n_decode": n_decode, "n_prefill": n_prefill, "decode_alone_ms": statistics.median(alone_d),
                 "prefill_alone_ms": statistics.median(alone_p)}
    for m in modes:
        out[m] = {k: statistics.median(r[i] for r in runs[m]) for i, k in enumerate(("decode_ms", "prefill_ms",
                                                                                       "makespan_ms"))}
    out["gain"] = out["serial"]["makespan_ms"] / min(out[m]["makespan_ms"] for m in modes[1:])
    return out
