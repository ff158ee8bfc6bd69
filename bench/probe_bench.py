"""ProbePrefix benchmark (not a test): one 2,000-token prompt probed over 8 pools, in process and over gRPC.

  python -m bench.probe_bench [--repeat N] [--out bench/results/cpu-probe/probe.json]

Each pool holds 50 cached prompts (100,000 tokens: 10 stems of 200 tokens, each with 5 tails of 1,960); the
probed prompt shares 1,900 tokens with a cached one in pools 0-3 and only its 200-token stem in pools 4-7.
Baseline, measured in the same run on the same prompt: what the probe replaces, a locking Match plus a
ReleaseRequests in each of the 8 pools (in process: CacheCore calls; gRPC: one Match and one ReleaseRequests
RPC per pool). Prints per-probe latency p50/p99 in microseconds for page sizes 1 and 16; writes the raw samples
and the summary as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
import uuid

from cache_svc.core import CacheCore
from cache_svc.items import CacheItem, MatchItem, Member
from cache_svc.service import SERVICE_NAME, CacheServicer
from codeserve.v1 import cache_pb2, cache_pb2_grpc
from common import grpc_server

POOLS = [f"pool{i}" for i in range(8)]
CAPACITY = 200_000


def op() -> str:
    return uuid.uuid4().hex


def fill(core: CacheCore, sid: str, pool: str, rng: random.Random, stems: list[list[int]]) -> list[list[int]]:
    """Caches 50 prompts of 2,160 tokens in ``pool``: each of the 10 stems with 5 random tails of 1,960."""
    prompts = [stem + [rng.randrange(50_000) for _ in range(1960)] for stem in stems for _ in range(5)]
    for i, p in enumerate(prompts):
        rid = f"fill-{pool}-{i}"
        m = core.match(op(), sid, pool, [MatchItem(rid, "", tuple(p), True)])
        core.allocate(op(), sid, pool, [(rid, len(p) - m.results[0].cached_tokens)])
        core.cache_requests(op(), sid, pool, [CacheItem(rid, tuple(p), True)])
    return prompts


def samples_us(fn, repeat: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e6)
    return out


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


def run(page_size: int, repeat: int) -> dict:
    rng = random.Random(page_size)
    core = CacheCore(lease_seconds=3600)
    sid = core.open_session("bench").session_id
    stems = [[rng.randrange(50_000) for _ in range(200)] for _ in range(10)]
    query = None
    for i, pool in enumerate(POOLS):
        core.register_pool(op(), pool, page_size, [Member(f"w{i}", "e", CAPACITY)])
        prompts = fill(core, sid, pool, random.Random(100 + i if i >= 4 else 100), stems)
        if query is None:
            query = prompts[7][:1900] + [rng.randrange(50_000) for _ in range(100)]
    running = grpc_server.start(lambda s: cache_pb2_grpc.add_CacheServicer_to_server(CacheServicer(core), s),
                                [SERVICE_NAME], "127.0.0.1:0")
    chan = grpc_server.channel(f"127.0.0.1:{running.port}")
    stub = cache_pb2_grpc.CacheStub(chan)
    n = iter(range(10**9))
    found = [p.cached_tokens for p in core.probe_prefix("", query, POOLS)]

    def probe_inproc() -> None:
        core.probe_prefix("", query, POOLS)

    def probe_grpc() -> None:
        stub.ProbePrefix(cache_pb2.ProbePrefixRequest(token_ids=query, pool_ids=POOLS))

    def match_release_inproc() -> None:
        rid = f"m{next(n)}"
        for pool in POOLS:
            core.match(op(), sid, pool, [MatchItem(rid, "", tuple(query), True)])
            core.release_requests(op(), sid, pool, [rid])

    def match_release_grpc() -> None:
        rid = f"m{next(n)}"
        for pool in POOLS:
            stub.Match(cache_pb2.MatchRequest(op_id=op(), session_id=sid, pool_id=pool, items=[
                cache_pb2.MatchItem(request_id=rid, token_ids=query, lock=True)]))
            stub.ReleaseRequests(cache_pb2.ReleaseRequestsRequest(op_id=op(), session_id=sid, pool_id=pool,
                                                                  request_ids=[rid]))

    raw = {name: samples_us(fn, repeat) for name, fn in (
        ("probe_inproc", probe_inproc), ("match_release_inproc", match_release_inproc),
        ("probe_grpc", probe_grpc), ("match_release_grpc", match_release_grpc))}
    assert all(core.check_integrity(p) == [] for p in POOLS)
    chan.close()
    running.server.stop(0)
    summary = {name: {"p50_us": round(pct(xs, 50), 1), "p99_us": round(pct(xs, 99), 1)} for name, xs in raw.items()}
    return {"page_size": page_size, "prompt_tokens": len(query), "pools": len(POOLS), "cached_per_pool": found,
            "repeat": repeat, "summary": summary, "samples_us": raw}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--out", default="bench/results/cpu-probe/probe.json")
    args = parser.parse_args()
    runs = [run(p, args.repeat) for p in (1, 16)]
    for r in runs:
        s = r["summary"]
        print(f"page {r['page_size']:2d}, {r['prompt_tokens']} tokens x {r['pools']} pools (cached {r['cached_per_pool']})")
        for mode in ("inproc", "grpc"):
            pr, base = s[f"probe_{mode}"], s[f"match_release_{mode}"]
            print(f"  {mode:6s}  ProbePrefix p50 {pr['p50_us']:8.0f} us  p99 {pr['p99_us']:8.0f} us   "
                  f"| baseline 8 x (Match+lock, Release) p50 {base['p50_us']:8.0f} us  p99 {base['p99_us']:8.0f} us")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"host": platform.node(), "python": platform.python_version(), "cpus": os.cpu_count(),
                   "runs": runs}, f)
    print(f"raw samples: {args.out}")


if __name__ == "__main__":
    main()
