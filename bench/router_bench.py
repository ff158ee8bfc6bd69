"""Routing benchmark (issue 11): a multi-tenant shared-prefix workload over 1 and 2 replicas, with the gateway's
``round_robin``, ``least_load`` and ``cache_aware`` routing, all measured in the same run.

Workload: ``--tenants`` tenants, each with its own ``--prefix-tokens`` prefix (a system prompt, a repository
context); each request is one tenant's prefix (chosen uniformly) + a fresh ``--suffix-tokens`` suffix, asking for
``--output-tokens`` (ignore_eos, greedy), arriving as a Poisson process at each rate of ``--rates`` (requests/s) for
``--duration`` s. Each replica's pool holds ``--pool-share`` of the tenants' prompts (prefix + suffix): below 1 the
working set exceeds one pool, and two pools hold it only when each replica keeps its own tenants.

Per run (replicas x policy x rate; the caches flushed before each): TTFT and ITL p50/p99, output tok/s, each
replica's prefix hit rate (its scheduler's prefix_hit_tokens / prefix_query_tokens over the run) and share of
requests, and the share of routing decisions whose predicted cached tokens equal the realized ones (the gateway's
``codeserve:route_predictions_total``). The table gives each run's output tok/s and TTFT p99 over round_robin's with 2
replicas at the same rate. Raw JSON: ``OUT/router_bench.json`` (written after every run), the table
``OUT/router_bench_table.txt``.

    python -m bench.router_bench --out bench/results/cpu-router           # CPU: default model, scaled down
    python -m bench.router_bench --gpu --out OUT                           # one GPU, two replicas sharing it
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import multiprocessing
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import httpx

from bench import loadgen
from codeserve.v1 import scheduler_pb2, scheduler_pb2_grpc
from common.grpc_server import channel
from launcher.config import StackConfig, commands
from launcher.stack import ROOT, Stack

POLICIES = ("round_robin", "least_load", "cache_aware")


def log(msg: str) -> None:
    print(f"[router_bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def workload(args, rate: float, seed: int) -> tuple[list[float], list[dict], list[int]]:
    """(arrival offsets in seconds, /generate payloads, tenant of each) of one run: Poisson at ``rate`` req/s for
    ``args.duration`` s. The tenants' prefixes depend on ``args.seed`` only (the same in every run)."""
    prefix_rng = random.Random(args.seed)
    prefixes = [[prefix_rng.randrange(args.vocab_lo, args.vocab_hi) for _ in range(args.prefix_tokens)]
                for _ in range(args.tenants)]
    rng = random.Random(seed)
    times, payloads, tenants, t = [], [], [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t > args.duration:
            return times, payloads, tenants
        tenant = rng.randrange(args.tenants)
        ids = prefixes[tenant] + [rng.randrange(args.vocab_lo, args.vocab_hi) for _ in range(args.suffix_tokens)]
        times.append(t)
        tenants.append(tenant)
        payloads.append({"input_ids": ids, "sampling_params": {"max_new_tokens": args.output_tokens,
                                                               "temperature": 0.0, "ignore_eos": True}})


async def _open_loop(url: str, start: float, times: list[float], payloads: list[dict]) -> list[loadgen.Record]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=httpx.Timeout(1200.0), limits=limits) as client:
        async def at(offset: float, payload: dict) -> loadgen.Record:
            await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
            return await loadgen.stream_one(client, url, payload)
        return list(await asyncio.gather(*(at(t, p) for t, p in zip(times, payloads))))


def _proc_main(args) -> list[dict]:
    return [asdict(r) for r in asyncio.run(_open_loop(*args))]


def open_loop(base_url: str, times: list[float], payloads: list[dict], procs: int) -> list[loadgen.Record]:
    """Sends payload i at ``times[i]`` s after a common start (not waiting for earlier answers: an open loop), over
    ``procs`` client processes (request i from process i % procs); Records in payload order."""
    url = base_url.rstrip("/") + "/generate"
    start = time.monotonic() + 0.5
    if procs == 1:
        return asyncio.run(_open_loop(url, start, times, payloads))
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        parts = pool.map(_proc_main, [(url, start, times[i::procs], payloads[i::procs]) for i in range(procs)])
    out: list[loadgen.Record | None] = [None] * len(payloads)
    for i, part in enumerate(parts):
        for j, r in enumerate(part):
            out[i + j * procs] = loadgen.Record(**r)
    return out  # type: ignore[return-value]


def metric_values(text: str, name: str) -> dict[str, float]:
    """{label text: value} of every sample of ``name`` in a Prometheus text exposition."""
    found = {}
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{.*\}})? (\S+)$", line)
        if m:
            found[m.group(1) or ""] = float(m.group(2))
    return found


class Bench:
    """One stack per replica count; the gateway restarted with each policy; results saved after every run."""

    def __init__(self, args) -> None:
        self.args = args
        self.out = pathlib.Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.results: dict = {"config": vars(args), "runs": []}
        self.stack: Stack | None = None

    def save(self) -> None:
        (self.out / "router_bench.json").write_text(json.dumps(self.results, indent=1))

    def model(self) -> str:
        if self.args.model_path:
            return self.args.model_path
        if not self.args.gpu:
            from worker_svc.model.default import ensure_default_model
            return str(ensure_default_model())
        path = pathlib.Path(self.args.model_dir)
        if not (path / "config.json").exists():
            subprocess.run([sys.executable, "-m", "worker_svc.model.default", "--shape", self.args.shape, "--dtype",
                            "bfloat16", "--device", "cuda", "--out", str(path)], check=True, cwd=ROOT)
        return str(path)

    def start(self, replicas: int) -> None:
        a = self.args
        cfg = StackConfig(model_path=self.model(), http_port=0, cache_port=0, worker_port=0, scheduler_port=0,
                          replicas=replicas, devices=",".join([a.device] * replicas),
                          dtype="bfloat16" if a.gpu else "float32", kv_tokens=a.kv_tokens, chunk_size=a.chunk_size,
                          max_running_requests=a.max_running, max_queued_requests=4096,
                          max_queued_tokens=1 << 30, progress_timeout=120.0)
        self.stack = Stack(cfg, self.out / "logs" / f"replicas-{replicas}")
        t = time.monotonic()
        self.stack.start(timeout=900)
        log(f"{replicas} replica(s) ready after {time.monotonic() - t:.1f} s (pool {a.kv_tokens} tokens each)")

    def stop(self) -> None:
        if self.stack is not None:
            self.stack.stop()
            self.stack = None

    def use_policy(self, policy: str) -> None:
        """Restarts the gateway with ``--routing policy`` (one replica: the gateway as the launcher starts it)."""
        cfg = dataclasses.replace(self.stack.cfg, routing=policy if len(self.stack.replicas) > 1 else "cache_aware")
        argv = commands(cfg, self.stack.model_path, ports=self.stack.ports)["gateway"]
        self.stack.kill("gateway", signal.SIGTERM)
        self.stack.start_one("gateway", argv, timeout=120)

    def loads(self) -> list[scheduler_pb2.GetLoadResponse]:
        out = []
        for r in self.stack.replicas:
            with channel(self.stack.target(r.scheduler)) as chan:
                out.append(scheduler_pb2_grpc.SchedulerStub(chan).GetLoad(scheduler_pb2.GetLoadRequest(), timeout=10))
        return out

    def run_one(self, replicas: int, policy: str, rate: float) -> dict:
        url = self.stack.url
        assert httpx.post(url + "/flush_cache", timeout=60).status_code == 200
        times, payloads, tenants = workload(self.args, rate, seed=int(rate * 1000))
        before, metrics0 = self.loads(), httpx.get(url + "/metrics", timeout=30).text
        recs = open_loop(url, times, payloads, self.args.client_procs)
        after, metrics1 = self.loads(), httpx.get(url + "/metrics", timeout=30).text
        summary = loadgen.summarize(recs)
        per = []
        for r, b, e in zip(self.stack.replicas, before, after):
            queried = e.prefix_query_tokens - b.prefix_query_tokens
            hits = e.prefix_hit_tokens - b.prefix_hit_tokens
            per.append({"replica": r.scheduler, "prompt_tokens": e.prompt_tokens_total - b.prompt_tokens_total,
                        "hit_rate": round(hits / queried, 4) if queried else None})
        total_prompt = sum(p["prompt_tokens"] for p in per) or 1
        for p in per:
            p["share"] = round(p["prompt_tokens"] / total_prompt, 4)
        name = "codeserve:route_predictions_total"
        delta = {k: v - metric_values(metrics0, name).get(k, 0.0) for k, v in metric_values(metrics1, name).items()}
        decided = sum(delta.values())
        exact = sum(v for k, v in delta.items() if 'outcome="exact"' in k)
        run = {"replicas": replicas, "policy": policy, "rate": rate, "arrivals": len(payloads),
               "offered_s": self.args.duration, **summary, "per_replica": per,
               "predicted_eq_realized": round(exact / decided, 4) if decided else None,
               "tenants_seen": len(set(tenants))}
        self.results["runs"].append(run)
        self.save()
        log(f"{replicas}x {policy} @ {rate}/s: " + json.dumps(
            {k: run.get(k) for k in ("ok", "errors", "output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
                                     "itl_p99_ms", "predicted_eq_realized")}) + f" per replica {per}")
        return run

    def table(self) -> str:
        runs = self.results["runs"]
        base = {r["rate"]: r for r in runs if r["replicas"] == 2 and r["policy"] == "round_robin"}
        head = ("| replicas | policy | rate/s | ok | tok/s | x rr | TTFT p50 ms | TTFT p99 ms | x rr | ITL p50 ms "
                "| ITL p99 ms | hit rate per replica | share per replica | pred==real |")
        lines = [head, "|" + "---|" * 14]
        for r in runs:
            b = base.get(r["rate"])
            ratio = lambda k: (f"{r[k] / b[k]:.2f}" if b and r.get(k) and b.get(k) else "-")  # noqa: E731
            hits = " / ".join("-" if p["hit_rate"] is None else f"{p['hit_rate']:.2f}" for p in r["per_replica"])
            share = " / ".join(f"{p['share']:.2f}" for p in r["per_replica"])
            pred = "-" if r["predicted_eq_realized"] is None else f"{r['predicted_eq_realized']:.2f}"
            lines.append(f"| {r['replicas']} | {r['policy']} | {r['rate']} | {r.get('ok', 0)}/{r['arrivals']} | "
                         f"{r.get('output_tok_s', '-')} | {ratio('output_tok_s')} | {r.get('ttft_p50_ms', '-')} | "
                         f"{r.get('ttft_p99_ms', '-')} | {ratio('ttft_p99_ms')} | {r.get('itl_p50_ms', '-')} | "
                         f"{r.get('itl_p99_ms', '-')} | {hits} | {share} | {pred} |")
        return "\n".join(lines)

    def run(self) -> None:
        a = self.args
        for replicas in a.replicas:
            self.start(replicas)
            try:
                for policy in (a.policies if replicas > 1 else ("single",)):
                    self.use_policy(policy)
                    for rate in a.rates:
                        self.run_one(replicas, policy, rate)
            finally:
                self.stop()
        table = self.table()
        (self.out / "router_bench_table.txt").write_text(table + "\n")
        print(table, flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for the JSON results, the table and the services' logs")
    ap.add_argument("--gpu", action="store_true", help="CUDA workers (both on --device), bf16, the full-size workload")
    ap.add_argument("--device", default=None, help="every worker's device (default: cuda:0 with --gpu, else cpu)")
    ap.add_argument("--model-path", default=None, help="checkpoint (default: the embedded model; --gpu: --shape)")
    ap.add_argument("--shape", default="starcoderbase-1b", help="--gpu: random-weight checkpoint of this shape")
    ap.add_argument("--model-dir", default="/tmp/codeserve-bench-model")
    ap.add_argument("--replicas", default="1,2", help="replica counts, in order")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--rates", default=None, help="Poisson arrival rates, requests/s (default: CPU 8,16,32; GPU 8,16,32,64)")
    ap.add_argument("--duration", type=float, default=None, help="seconds of arrivals per run (CPU 20, GPU 15)")
    ap.add_argument("--tenants", type=int, default=32)
    ap.add_argument("--prefix-tokens", type=int, default=None, help="per tenant (GPU 3000; CPU 600)")
    ap.add_argument("--suffix-tokens", type=int, default=None, help="per request (GPU 200; CPU 40)")
    ap.add_argument("--output-tokens", type=int, default=None, help="per request (GPU 128; CPU 26)")
    ap.add_argument("--pool-share", type=float, default=0.75,
                    help="each pool holds this share of the tenants' prompts (prefix + suffix)")
    ap.add_argument("--kv-tokens", type=int, default=None, help="KV pool per replica (default: from --pool-share)")
    ap.add_argument("--chunk-size", type=int, default=None, help="(GPU 8192; CPU 512)")
    ap.add_argument("--max-running", type=int, default=None, help="per replica (GPU 128; CPU 16)")
    ap.add_argument("--client-procs", type=int, default=None, help="(GPU 4; CPU 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    gpu = args.gpu
    for name, on_gpu, on_cpu in (("device", "cuda:0", "cpu"), ("rates", "8,16,32,64", "8,16,32"), ("duration", 15.0, 20.0),
                                 ("prefix_tokens", 3000, 600), ("suffix_tokens", 200, 40), ("output_tokens", 128, 26),
                                 ("chunk_size", 8192, 512), ("max_running", 128, 16), ("client_procs", 4, 1)):
        if getattr(args, name) is None:
            setattr(args, name, on_gpu if gpu else on_cpu)
    args.rates = [float(r) for r in str(args.rates).split(",")]
    args.replicas = [int(r) for r in str(args.replicas).split(",")]
    args.policies = [p for p in str(args.policies).split(",")]
    args.vocab_lo, args.vocab_hi = (100, 49000) if gpu else (3, 1000)
    if args.kv_tokens is None:
        args.kv_tokens = int(args.pool_share * args.tenants * (args.prefix_tokens + args.suffix_tokens))
    bench = Bench(args)
    try:
        bench.run()
    finally:
        bench.stop()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
