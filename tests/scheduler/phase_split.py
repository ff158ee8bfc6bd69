"""Where a decode round's time goes on the CPU stack (not a test: a measurement to run by hand).

    python -m tests.scheduler.phase_split [--concurrency 64] [--decode-steps 8] [--new 64] [--no-overlap]
        [--prompt-len 64] [--model-path DIR --device cuda --dtype bfloat16 --kv-tokens N]

Starts cache + worker + scheduler (tests/stack.py; CPU fp32 default model unless told), sends ``concurrency``
greedy requests at once (a ``prompt-len``-token prompt each, ``new`` output tokens, ignore_eos), and prints the scheduler's decode counters
(loop_stats) over the run per decode step: wall, worker forward, Allocate, Forward RPC wait, result
processing, and the share of the wall outside the worker's forward.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time

from tests.stack import Backend, generate_many
from worker_svc.model.default import ensure_default_model

KEYS = ("decode_batches", "decode_steps", "decode_wall_seconds", "decode_forward_seconds", "decode_alloc_seconds",
        "decode_rpc_seconds", "decode_process_seconds", "decode_chained")


def last_stats(be: Backend) -> dict:
    lines = [ln for ln in be.stack.log_tail("scheduler", 1 << 22).splitlines() if '"event": "loop_stats"' in ln]
    return json.loads(lines[-1]) if lines else {k: 0 for k in KEYS}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--model-path", default=None, help="checkpoint (default: the embedded default model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--kv-tokens", type=int, default=32768)
    ap.add_argument("--chunk-size", type=int, default=512)
    a = ap.parse_args()
    args = ("--decode-steps", str(a.decode_steps)) + (() if a.overlap else ("--no-overlap",))
    with Backend.start(pathlib.Path(tempfile.mkdtemp()), model_path=a.model_path or str(ensure_default_model()),
                       kv_tokens=a.kv_tokens, device=a.device, dtype=a.dtype, chunk_size=a.chunk_size,
                       max_running_requests=max(64, a.concurrency), scheduler_args=args, timeout=600) as be:
        reqs = [dict(input_ids=[(7 * i + 13 * j) % 900 + 10 for j in range(a.prompt_len)], max_new_tokens=a.new,
                     ignore_eos=True) for i in range(a.concurrency)]
        generate_many(be.scheduler, reqs[:4])  # warm-up
        time.sleep(2.6)
        before = last_stats(be)
        t0 = time.monotonic()
        outs = generate_many(be.scheduler, reqs)
        took = time.monotonic() - t0
        time.sleep(2.6)
        after = last_stats(be)
    d = {k: after.get(k, 0) - before.get(k, 0) for k in KEYS}
    n = max(d["decode_steps"], 1)
    ms = {k.replace("decode_", "").replace("_seconds", ""): round(1000 * d[k] / n, 3) for k in KEYS if k.endswith("seconds")}
    print(json.dumps(dict(overlap=a.overlap, concurrency=a.concurrency, decode_steps_flag=a.decode_steps,
                          tokens=sum(len(o.token_ids) for o in outs), seconds=round(took, 2),
                          decode_batches=d["decode_batches"], decode_steps=d["decode_steps"], chained=d["decode_chained"],
                          per_step_ms=ms, outside=round(1 - d["decode_forward_seconds"] / max(d["decode_wall_seconds"], 1e-9), 3))))


if __name__ == "__main__":
    main()
