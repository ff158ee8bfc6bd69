"""The editor workload: simulated typists doing fill-in-the-middle completions at keystroke rate.

Each typist edits a HumanEval file (``bench/humaneval_fim.py``: prompt + canonical solution cut into prefix /
middle / suffix, single-line and multi-line spans) by typing its middle one character a keystroke. Every
keystroke (50-150 ms apart) sends a streamed ``/v1/completions`` request with ``suffix`` and cancels the
previous one (as Continue does); after a burst of 5-15 keystrokes the typist waits for the last completion
(it is answered) and reads for 0.3-0.8 s. A typist that has typed the whole middle moves to the next file.
The same file is completed again and again, so the prefix cache matters.

Figures (JSON under --out, one file per FIM layout): TTFT p50/p90/p99 of answered requests (sent -> first
token-bearing chunk), aborts per second (requests cancelled by the next keystroke), cache hit rate (the
answered requests' cached_tokens / prompt_tokens, and the server's prefix-cache counters from /metrics over
the run), prompt lengths, HTTP errors, and (when it started the stack) each service's CPU milliseconds per
request: the host cost that queues requests behind each other at 20 typists.

    python -m bench.editor_bench --out bench/results/cpu-editor              # starts the CPU stack
    python -m bench.editor_bench --url http://127.0.0.1:8000 --out OUT       # an already running server
    python -m bench.editor_bench --gpu --model-path DIR --out OUT            # on a GPU
    python -m bench.editor_bench --gpu --model-path DIR --context-files 4 --out OUT  # ~1,500-token prompts

``--hop-trace DIR`` traces every request's hops through the stack it starts (``common/hop_trace.py``: the
client's send and first text, the gateway, the scheduler, the worker) and adds the time between consecutive
hops (``bench/hop_report.py``) of the requests whose first text arrived (answered, or cancelled after it) to the
JSON (``hops``): where a keystroke's TTFT goes.

``--context-files K`` puts K other HumanEval problems (prompt + canonical solution) above each file's prefix,
as the rest of a source file an editor sends with the cursor's function: HumanEval files alone are ~300
tokens (median, the embedded tokenizer), four more make the ~1,500-token prompts of issue 13's H200 target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import random
import re
import statistics
import time

import httpx

from bench import hop_report, proc_cpu
from common import hop_trace
from bench.humaneval_fim import FimCut, cuts, problems

ROOT = pathlib.Path(__file__).resolve().parents[1]


def pct(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1, nearest rank) of ``values``, None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


async def completion(client: httpx.AsyncClient, body: dict, rec: dict) -> None:
    """One streamed FIM completion; fills ``rec`` (status, ttft, usage) as it goes."""
    sent, sent_ns = time.monotonic(), time.monotonic_ns()
    async with client.stream("POST", "/v1/completions", json=body) as reply:
        rec["status"] = reply.status_code
        if reply.status_code != 200:
            rec["error"] = (await reply.aread())[:200].decode(errors="replace")
            return
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if hop_trace.enabled():  # the scheduler's request id of choice 0 (the gateway's, as it sent it)
                hop_trace.mark(f"{chunk['id']}-0", "client_sent", sent_ns)
            if chunk.get("usage"):
                rec["prompt_tokens"] = chunk["usage"]["prompt_tokens"]
                rec["cached_tokens"] = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
            if any(c["text"] for c in chunk["choices"]) and "ttft" not in rec:
                rec["ttft"] = time.monotonic() - sent
                hop_trace.mark(f"{chunk['id']}-0", "client_text")
    rec["done"] = True


async def typist(i: int, client: httpx.AsyncClient, files: list[FimCut], args, until: float, recs: list) -> None:
    """Typist ``i`` until ``until`` (time.monotonic): bursts of keystrokes, one request each, the previous one
    cancelled; appends one record per request to ``recs``."""
    rng = random.Random(args.seed * 1000 + i)
    k = i
    while time.monotonic() < until:
        cut = files[k % len(files)]
        typed = 0
        while typed < len(cut.middle) and time.monotonic() < until:
            task, rec = None, None
            for _ in range(rng.randint(5, 15)):
                typed = min(typed + 1, len(cut.middle))
                body = {"model": args.model, "prompt": cut.prefix + cut.middle[:typed], "suffix": cut.suffix,
                        "fim_mode": args.mode, "max_tokens": args.max_tokens, "temperature": 0, "stream": True,
                        "stream_options": {"include_usage": True}}
                if task is not None and not task.done():
                    task.cancel()
                    rec["cancelled"] = True
                rec = {"typist": i, "task_id": cut.task_id, "kind": cut.kind}
                recs.append(rec)
                task = asyncio.create_task(completion(client, body, rec))
                await asyncio.sleep(rng.uniform(0.05, 0.15))
            try:
                await task  # the burst's last request is answered
            except httpx.HTTPError as exc:
                rec["error"] = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(rng.uniform(0.3, 0.8))
        k += len(files) // max(args.typists, 1) or 1


def with_context(files: list[FimCut], k: int) -> list[FimCut]:
    """Each cut with the full text of ``k`` other problems (the next ones in HumanEval order) above its prefix."""
    if k <= 0:
        return files
    texts = {p["task_id"]: p["prompt"] + p["canonical_solution"] for p in problems()}
    order = list(texts)
    out = []
    for c in files:
        at = order.index(c.task_id)
        above = "\n".join(texts[order[(at + j) % len(order)]] for j in range(1, k + 1))
        out.append(FimCut(c.task_id, c.kind, above + "\n" + c.prefix, c.middle, c.suffix))
    return out


def server_counters(url: str) -> dict[str, float]:
    """From the server's /metrics: prefix-cache hit and queried tokens, and the scheduler's TTFT histogram's sum
    (seconds) and count (``vllm:time_to_first_token_seconds``: from a Generate call's arrival at the scheduler to
    its first message with tokens)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    def total(name: str) -> float:
        return sum(float(m) for m in re.findall(rf"^{name}(?:_total)?(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))
    return {"hits": total("vllm:prefix_cache_hits"), "queries": total("vllm:prefix_cache_queries"),
            "ttft_sum": total("vllm:time_to_first_token_seconds_sum"),
            "ttft_count": total("vllm:time_to_first_token_seconds_count")}


async def run_mode(args, url: str, files: list[FimCut], pids: dict[str, int] | None = None) -> dict:
    """One timed run of ``args.typists`` typists in FIM layout ``args.mode``; returns the figures. ``pids``
    (service name -> PID, when this process started the stack): their CPU time per request is reported too."""
    recs: list[dict] = []
    before = server_counters(url)
    cpu_before = proc_cpu.snapshot(pids) if pids else None
    limits = httpx.Limits(max_connections=args.typists * 4, max_keepalive_connections=args.typists * 4)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        t0 = time.monotonic()
        await asyncio.gather(*(typist(i, client, files, args, t0 + args.duration, recs) for i in range(args.typists)))
        wall = time.monotonic() - t0
    after = server_counters(url)
    cpu = proc_cpu.per_request_ms(cpu_before, proc_cpu.snapshot(pids), max(1, len(recs))) if pids else None
    d = {k: after[k] - before[k] for k in after}
    answered = [r for r in recs if r.get("done") and not r.get("cancelled")]
    ttfts = [1000 * r["ttft"] for r in answered if "ttft" in r]
    cancelled = [r for r in recs if r.get("cancelled")]
    with_usage = [r for r in answered if "prompt_tokens" in r]
    return {
        "mode": args.mode, "typists": args.typists, "duration_s": round(wall, 2), "requests": len(recs),
        "answered": len(answered), "cancelled": len(cancelled), "aborts_per_s": round(len(cancelled) / wall, 2),
        "http_5xx": sum(1 for r in recs if r.get("status", 0) >= 500),
        "errors": sorted({r["error"] for r in recs if "error" in r})[:5],
        "ttft_ms": {"p50": pct(ttfts, 0.5), "p90": pct(ttfts, 0.9), "p99": pct(ttfts, 0.99),
                    "mean": statistics.fmean(ttfts) if ttfts else None},
        "prompt_tokens": {"p50": pct([r["prompt_tokens"] for r in with_usage], 0.5),
                          "max": max((r["prompt_tokens"] for r in with_usage), default=None)},
        "answered_cache_hit_rate": (sum(r["cached_tokens"] for r in with_usage)
                                    / max(1, sum(r["prompt_tokens"] for r in with_usage))),
        "server_prefix_hit_rate": d["hits"] / max(1.0, d["queries"]),
        "server_prefix_tokens": {"hit": d["hits"], "queried": d["queries"]},
        # the scheduler's share: its mean TTFT over every call that got a first token (cancelled ones too), so the
        # gateway's and the HTTP client's share of the answered requests' mean is roughly ttft mean - this
        "scheduler_ttft_mean_ms": 1000 * d["ttft_sum"] / d["ttft_count"] if d["ttft_count"] else None,
        # host cost: each service's CPU milliseconds (all threads) per request sent, cancelled ones included
        "cpu_ms_per_request": cpu,
    }


def start_stack(args, out: pathlib.Path):
    """Starts the four services (logs under ``out/logs``); returns the launcher's Stack."""
    from launcher.config import StackConfig, commands
    from launcher.stack import Stack
    from worker_svc.model.default import ensure_default_model

    model = args.model_path or str(ensure_default_model())
    cfg = StackConfig(model_path=model, http_port=0, cache_port=0, worker_port=0, scheduler_port=0,
                      device="cuda" if args.gpu else "cpu", dtype="bfloat16" if args.gpu else "float32",
                      kv_tokens=args.kv_tokens, page_size=args.page_size, max_queued_requests=4096,
                      progress_timeout=120.0, extend_graph_max_tokens=args.extend_graph_max_tokens,
                      decode_steps=args.decode_steps)
    stack = Stack(cfg, out / "logs", model_path=model)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    argv = commands(stack.cfg, model)
    argv["scheduler"] = argv["scheduler"] + args.scheduler_flags.split()
    argv["worker"] = argv["worker"] + args.worker_flags.split()
    for name in ("cache", "worker", "scheduler", "gateway"):
        stack.start_one(name, argv[name], timeout=600)
    return stack


def main(argv: list[str] | None = None) -> None:
    """CLI: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--url", default=None, help="a running server (default: start the stack here)")
    ap.add_argument("--model", default=None, help="model name (default: the server's)")
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--kv-tokens", type=int, default=131072)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--typists", type=int, default=20)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of typing per mode")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--extend-graph-max-tokens", type=int, default=1024, help="the worker's (0: eager extends)")
    ap.add_argument("--decode-steps", type=int, default=0, help="the scheduler's (0: auto, 8 on a GPU)")
    ap.add_argument("--modes", default="psm,spm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--context-files", type=int, default=0,
                    help="other HumanEval files put above each prefix (longer prompts; see the module doc)")
    ap.add_argument("--scheduler-flags", default="", help="extra scheduler flags, space-separated, for an A/B "
                    "(e.g. --no-adaptive-steps)")
    ap.add_argument("--worker-flags", default="", help="extra worker flags, space-separated (e.g. --splitk-rows 0)")
    ap.add_argument("--hop-trace", default=None, help="trace each request's hops into this directory (module doc)")
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.hop_trace:
        if args.url:
            ap.error("--hop-trace needs the stack started here (without --url)")
        os.environ[hop_trace.ENV] = args.hop_trace  # the services it starts inherit it
        hop_trace.configure("client", args.hop_trace)
    stack = None if args.url else start_stack(args, out)
    url = args.url or stack.url
    try:
        args.model = args.model or httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        files = with_context(cuts(seed=args.seed), args.context_files)
        random.Random(args.seed).shuffle(files)
        for mode in args.modes.split(","):
            args.mode = mode
            pids = {name: proc.pid for name, proc in stack.procs.items()} if stack is not None else None
            result = asyncio.run(run_mode(args, url, files, pids))
            result["page_size"] = args.page_size
            result["device"] = "cuda" if args.gpu else "cpu"
            result["context_files"] = args.context_files
            result["extend_graph_max_tokens"] = args.extend_graph_max_tokens
            result["decode_steps"] = args.decode_steps
            result["scheduler_flags"] = args.scheduler_flags
            result["worker_flags"] = args.worker_flags
            if args.hop_trace:  # cumulative over the modes run so far
                result["hops"] = hop_report.segments(hop_report.load(args.hop_trace), "client_text")
            (out / f"editor_{mode}.json").write_text(json.dumps(result, indent=2) + "\n")
            print(json.dumps(result), flush=True)
    finally:
        if stack is not None:
            stack.stop()


if __name__ == "__main__":
    main()
