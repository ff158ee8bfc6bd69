"""Soak: all four services under a mixed load for a bounded time, then checks that nothing leaked.

  python -m bench.soak [--duration 300] [--requests N] [--concurrency 32] [--cancel-fraction 0.2]
                       [--invalid-fraction 0.05] [--kv-tokens 32768] [--seed 0] [--log-dir DIR]

Starts cache, worker, scheduler and gateway (CPU, fp32, the embedded default model, free loopback ports).
``concurrency`` clients send requests back to back over HTTP until ``duration`` seconds have passed or
``requests`` have been sent: random prompt lengths (token ids, 4 .. --max-prompt tokens), random output lengths,
/v1/completions and /generate, streamed or not, greedy or seeded sampling; a ``cancel-fraction`` of them close
their connection at a random moment (waiting or mid-stream); an ``invalid-fraction`` are invalid (empty prompt,
token id outside the vocabulary, prompt over the context limit, negative max_tokens, n too large, malformed
JSON) and must get a 4xx. At the end, at idle: the cache's integrity check is empty, available + evictable ==
capacity, after a flush available == capacity, every process is alive, its RSS (VmRSS) grew by at most
--max-rss-growth-mib between two idle points (after --warmup seconds of the same load and the peak, every client's
largest request at once, and at the end: a process's allocator keeps what the largest batch needed, so a cold start
is no baseline; the services run with glibc's malloc on a fixed mmap threshold, ``ALLOCATOR_ENV``), and a greedy
probe prompt gives the same tokens as at the start. Prints counts and p50/p99 latency (and TTFT for streams); exit
code 1 when a check failed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
import httpx

from codeserve.v1 import cache_pb2, cache_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from launcher.config import StackConfig
from launcher.stack import Stack

SERVICES = ("cache", "worker", "scheduler", "gateway")
VOCAB = 1024          # the embedded default model
N_POSITIONS = 4096
# glibc's malloc raises its mmap threshold each time a large mmapped block is freed (up to 32 MiB), after which the
# worker's activation buffers come from the heap and a freed one stays resident: the worker's idle RSS then moves with
# whichever batch shapes came last, not with what is live (session 31's CI run: 580 -> 779 MiB at idle, no leak; here
# 489-651 MiB under load). A fixed threshold keeps blocks over 128 KiB in their own mappings, returned when freed, and
# two arenas bound what the threads' arenas cache (same run, same load: 451-465 MiB), so growth measures what stays live.
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_ARENA_MAX": "2"}


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB, from /proc/<pid>/status (VmRSS)."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank; nan when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


@dataclass
class Tally:
    """Thread-safe counts and latencies (seconds)."""

    counts: Counter = field(default_factory=Counter)
    latency: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, latency: float | None = None, ttft: float | None = None, problem: str = "") -> None:
        with self.lock:
            self.counts[kind] += 1
            if latency is not None:
                self.latency.append(latency)
            if ttft is not None:
                self.ttft.append(ttft)
            if problem:
                self.unexpected.append(problem)


def invalid_request(rng: random.Random) -> tuple[str, dict | bytes]:
    """(path, body) of a request that must be refused with a 4xx."""
    kind = rng.randrange(6)
    if kind == 0:
        return "/v1/completions", {"prompt": "", "max_tokens": 4}
    if kind == 1:
        return "/generate", {"input_ids": [1, 2, VOCAB + 5], "sampling_params": {"max_new_tokens": 4}}
    if kind == 2:
        return "/generate", {"input_ids": [7] * (N_POSITIONS + 10), "sampling_params": {"max_new_tokens": 4}}
    if kind == 3:
        return "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": -1}
    if kind == 4:
        return "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 2, "n": 1000}
    return "/v1/completions", b'{"prompt": [5, 6'


def valid_request(rng: random.Random, max_prompt: int, max_new: int) -> tuple[str, dict, bool]:
    """(path, body, streamed) of a valid request with a random prompt of token ids."""
    n = rng.randint(4, max_prompt)
    ids = [rng.randrange(5, VOCAB - 1) for _ in range(n)]
    new = rng.randint(1, max_new)
    stream = rng.random() < 0.5
    greedy = rng.random() < 0.7
    if rng.random() < 0.5:
        body = {"prompt": ids, "max_tokens": new, "stream": stream, "ignore_eos": True,
                "temperature": 0 if greedy else 0.8}
        if not greedy:
            body["seed"] = rng.randrange(1 << 30)
        return "/v1/completions", body, stream
    params = {"max_new_tokens": new, "ignore_eos": True, "temperature": 0 if greedy else 0.8}
    if not greedy:
        params["sampling_seed"] = rng.randrange(1 << 30)
    return "/generate", {"input_ids": ids, "sampling_params": params, "stream": stream}, stream


def one(client: httpx.Client, rng: random.Random, args, tally: Tally) -> None:
    """Sends one request and records what it ended with."""
    if rng.random() < args.invalid_fraction:
        path, body = invalid_request(rng)
        kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) \
            else {"json": body}
        r = client.post(path, timeout=60, **kw)
        if 400 <= r.status_code < 500:
            tally.add(f"invalid_{r.status_code}")
        else:
            tally.add("unexpected", problem=f"invalid request {path} {str(body)[:80]} got {r.status_code}: {r.text[:200]}")
        return
    path, body, stream = valid_request(rng, args.max_prompt, args.max_new)
    cancel_at = rng.uniform(0.0, args.cancel_within) if rng.random() < args.cancel_fraction else None
    t0 = time.monotonic()
    ttft = None
    try:
        timeout = httpx.Timeout(args.request_timeout, connect=10, read=cancel_at if cancel_at is not None else
                                args.request_timeout)
        with client.stream("POST", path, json=body, timeout=timeout) as r:
            if r.status_code != 200:
                r.read()
                kind = "overloaded" if r.status_code == 429 else "unexpected"
                tally.add(kind, problem="" if kind == "overloaded" else f"{path} got {r.status_code}: {r.text[:200]}")
                return
            done = not stream
            for line in r.iter_lines():
                if ttft is None and line.startswith("data: "):
                    ttft = time.monotonic() - t0
                if cancel_at is not None and time.monotonic() - t0 > cancel_at:
                    tally.add("cancelled")
                    return
                if '"error"' in line and line.startswith("data: ") and "error" in json.loads(line[6:]):
                    tally.add("unexpected", problem=f"{path} error event: {line[:200]}")
                    return
                done = done or line == "data: [DONE]"
            if not done:
                tally.add("unexpected", problem=f"{path} stream ended without [DONE]")
                return
            tally.add("ok", latency=time.monotonic() - t0, ttft=ttft if stream else None)
    except httpx.ReadTimeout:
        if cancel_at is not None:
            tally.add("cancelled")
        else:
            tally.add("unexpected", problem=f"{path} timed out after {time.monotonic() - t0:.1f} s")
    except httpx.HTTPError as exc:
        tally.add("unexpected", problem=f"{path} {type(exc).__name__}: {exc}")


def probe(url: str) -> list[int]:
    """Greedy output ids of a fixed prompt (detects state corruption between start and end)."""
    r = httpx.post(url + "/generate", json={"input_ids": [17, 99, 254, 3, 600, 42, 8, 77],
                                            "sampling_params": {"max_new_tokens": 24, "temperature": 0,
                                                                "ignore_eos": True}}, timeout=60)
    r.raise_for_status()
    return r.json()["output_ids"]


def settle(stack: Stack, timeout: float = 120.0) -> list[str]:
    """Waits for idle and checks the pool; returns the problems found (empty = clean)."""
    problems = []
    with grpc.insecure_channel(stack.target("scheduler")) as sc, grpc.insecure_channel(stack.target("cache")) as cc:
        sched, cache = scheduler_pb2_grpc.SchedulerStub(sc), cache_pb2_grpc.CacheStub(cc)
        deadline = time.monotonic() + timeout
        while True:
            load = sched.GetLoad(scheduler_pb2.GetLoadRequest(), timeout=10)
            if load.running == 0 and load.waiting == 0:
                break
            if time.monotonic() > deadline:
                return [f"not idle after {timeout} s: running {load.running}, waiting {load.waiting}"]
            time.sleep(0.1)
        c = cache.GetPool(cache_pb2.GetPoolRequest(pool_id="default"), timeout=10).pools[0].counters
        if c.available + c.evictable != c.capacity:
            problems.append(f"at idle available {c.available} + evictable {c.evictable} != capacity {c.capacity}: {c}")
        violations = list(cache.CheckIntegrity(cache_pb2.CheckIntegrityRequest(pool_id="default"), timeout=30).violations)
        if violations:
            problems.append(f"integrity violations: {violations}")
        sched.FlushCache(scheduler_pb2.FlushCacheRequest(), timeout=10)
        c = cache.GetPool(cache_pb2.GetPoolRequest(pool_id="default"), timeout=10).pools[0].counters
        if c.available != c.capacity:
            problems.append(f"after flush available {c.available} != capacity {c.capacity} (leaked slots)")
    return problems


def drive(url: str, args: argparse.Namespace, seconds: float, tally: Tally, seed: int) -> tuple[int, list[str]]:
    """``args.concurrency`` clients send requests back to back for ``seconds`` (or until ``args.requests`` are
    sent), tallying outcomes into ``tally``; returns (requests sent, names of client threads still running)."""
    sent = [0]
    sent_lock = threading.Lock()
    t_end = time.monotonic() + seconds

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        with httpx.Client(base_url=url) as http:
            while time.monotonic() < t_end:
                with sent_lock:
                    if args.requests and sent[0] >= args.requests:
                        return
                    sent[0] += 1
                one(http, rng, args, tally)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + args.request_timeout + 30)
    return sent[0], [t.name for t in threads if t.is_alive()]


def peak(url: str, args: argparse.Namespace, seed: int) -> list[str]:
    """The largest shapes the load can make, once, before the starting RSS is read: ``args.concurrency`` requests of
    ``args.max_prompt`` distinct random tokens and ``args.max_new`` new tokens sent at once (full prefill chunks,
    the widest decode batch). A random warm-up may miss them: session 26's CI run read its start after one that did
    (worker 561 MiB) and its end after the load met them (754 MiB), where a run whose warm-up met them grew 756 ->
    820. Returns what failed (a non-200 answer: the warm-up's own problem)."""
    failed: list[str] = []

    def send(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        ids = [rng.randrange(5, VOCAB - 1) for _ in range(args.max_prompt)]
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": args.max_new, "ignore_eos": True,
                                                      "temperature": 0}}
        r = httpx.post(f"{url}/generate", json=body, timeout=args.request_timeout)
        if r.status_code != 200:
            failed.append(f"peak request {i}: HTTP {r.status_code} {r.text[:200]}")

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(args.request_timeout + 30)
    return failed + [f"peak request thread {t.name} still running" for t in threads if t.is_alive()]


def run(args: argparse.Namespace) -> dict:
    """Starts the stack, runs the load, checks; returns the report (``report["problems"]`` empty = pass)."""
    log_dir = pathlib.Path(args.log_dir or tempfile.mkdtemp(prefix="soak-"))
    cfg = StackConfig(http_port=0, cache_port=0, worker_port=0, scheduler_port=0, device="cpu", dtype="float32",
                      kv_tokens=args.kv_tokens, chunk_size=args.chunk_size, max_running_requests=args.max_running,
                      max_queued_requests=args.max_queued)
    stack = Stack(cfg, log_dir, env=dict(ALLOCATOR_ENV))
    report: dict = {"log_dir": str(log_dir)}
    try:
        stack.start()
        url = stack.url
        first = probe(url)
        # Warm-up: the same load, so every process has met the largest shapes (the worker's allocator keeps
        # what one 1,000-token prefill needs); RSS is then read at idle before and after the measured load.
        warm = Tally()
        problems: list[str] = []
        if args.warmup > 0:
            drive(url, args, args.warmup, warm, seed=args.seed + 7919)
            problems += [f"warm-up: {p}" for p in peak(url, args, seed=args.seed + 7907)]
            problems += settle(stack)
        rss0 = {n: rss_mib(stack.procs[n].pid) for n in SERVICES}
        tally = Tally()
        samples: list[dict] = []
        sampling = threading.Event()

        def sample() -> None:  # RSS over time, to tell a plateau from a leak
            while not sampling.wait(args.rss_every):
                samples.append({"t": round(time.monotonic() - t0), **{n: round(rss_mib(stack.procs[n].pid))
                                                                       for n in SERVICES}})

        t0 = time.monotonic()
        if args.rss_every > 0:
            threading.Thread(target=sample, daemon=True).start()
        sent, stuck = drive(url, args, args.duration, tally, seed=args.seed)
        wall = time.monotonic() - t0
        sampling.set()
        report["rss_series_mib"] = samples
        problems += [f"client thread {name} still running" for name in stuck]
        problems += [f"{n} exited with {stack.procs[n].poll()}" for n in SERVICES if stack.procs[n].poll() is not None]
        if not problems:
            problems += settle(stack)
            last = probe(url)
            if last != first:
                problems.append(f"greedy probe changed: {first} -> {last}")
            rss1 = {n: rss_mib(stack.procs[n].pid) for n in SERVICES}
            growth = {n: rss1[n] - rss0[n] for n in SERVICES}
            problems += [f"{n} RSS grew {growth[n]:.0f} MiB ({rss0[n]:.0f} -> {rss1[n]:.0f})" for n in SERVICES
                         if growth[n] > args.max_rss_growth_mib]
            report["rss_mib"] = {n: [round(rss0[n]), round(rss1[n])] for n in SERVICES}
        problems += [f"warm-up: {p}" for p in warm.unexpected[:10]] + tally.unexpected[:20]
        report.update(sent=sent, wall_s=round(wall, 1), counts=dict(tally.counts),
                      latency_s={"p50": round(pct(tally.latency, 0.5), 3), "p99": round(pct(tally.latency, 0.99), 3),
                                 "n": len(tally.latency)},
                      ttft_s={"p50": round(pct(tally.ttft, 0.5), 3), "p99": round(pct(tally.ttft, 0.99), 3),
                              "n": len(tally.ttft)},
                      problems=problems)
    finally:
        codes = stack.stop()
        report["exit_codes"] = codes
        bad = {n: c for n, c in codes.items() if c != 0}
        if bad and "problems" in report:
            report["problems"].append(f"exit codes after SIGTERM: {bad}")
    return report


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    p.add_argument("--requests", type=int, default=0, help="stop after this many requests (0 = no limit)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--cancel-fraction", type=float, default=0.2)
    p.add_argument("--cancel-within", type=float, default=3.0, help="a cancelling client leaves within this many s")
    p.add_argument("--invalid-fraction", type=float, default=0.05)
    p.add_argument("--max-prompt", type=int, default=1500, help="longest random prompt (tokens)")
    p.add_argument("--max-new", type=int, default=64, help="most new tokens per request")
    p.add_argument("--kv-tokens", type=int, default=32768)
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--max-running", type=int, default=32)
    p.add_argument("--max-queued", type=int, default=1024)
    p.add_argument("--request-timeout", type=float, default=120.0, help="client timeout of one request (s)")
    p.add_argument("--warmup", type=float, default=5.0,
                   help="seconds of the same load before the starting RSS is read at idle (0 = read after one probe)")
    p.add_argument("--max-rss-growth-mib", type=float, default=150.0)
    p.add_argument("--rss-every", type=float, default=0.0, help="also sample every process's RSS every S s (0 = off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    report = run(args)
    print(json.dumps({k: v for k, v in report.items()}, indent=1))
    c = report.get("counts", {})
    print(f"soak: {report.get('sent', 0)} requests in {report.get('wall_s')} s at concurrency {args.concurrency}: "
          f"ok {c.get('ok', 0)}, cancelled {c.get('cancelled', 0)}, invalid->4xx "
          f"{sum(v for k, v in c.items() if k.startswith('invalid_'))}, overloaded(429) {c.get('overloaded', 0)}, "
          f"unexpected {c.get('unexpected', 0)}; latency p50 {report.get('latency_s', {}).get('p50')} s "
          f"p99 {report.get('latency_s', {}).get('p99')} s; TTFT p50 {report.get('ttft_s', {}).get('p50')} s "
          f"p99 {report.get('ttft_s', {}).get('p99')} s; RSS MiB start->end {report.get('rss_mib')}")
    print("PASS" if not report.get("problems") else "FAIL: " + "; ".join(report["problems"]))
    return 0 if not report.get("problems") else 1


if __name__ == "__main__":
    sys.exit(main())
