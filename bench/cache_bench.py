"""Cache service benchmark (not a test): in process and over loopback gRPC.

  python -m bench.cache_bench [--repeat N]

Cases: match-and-lock of a 2,000-token prompt against a tree of 100,000 cached tokens; one decode-step
allocation for 256 requests; evicting 10,000 tokens. Prints microseconds per operation (median of N).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid

from cache_svc.core import CacheCore
from cache_svc.items import CacheItem, MatchItem, Member
from cache_svc.service import SERVICE_NAME, CacheServicer
from codeserve.v1 import cache_pb2, cache_pb2_grpc
from common import grpc_server

CAPACITY = 400_000


def op() -> str:
    return uuid.uuid4().hex


def fill(core: CacheCore, sid: str, rng: random.Random) -> list[list[int]]:
    """Caches 50 prompts (100,000 tokens in the tree): 10 stems of 200 tokens, each with 5 tails of 1,960."""
    prompts = []
    for g in range(10):
        stem = [rng.randrange(50_000) for _ in range(200)]
        for i in range(5):
            prompts.append(stem + [rng.randrange(50_000) for _ in range(1960)])
    for i, p in enumerate(prompts):
        rid = f"fill{i}"
        m = core.match(op(), sid, "p", [MatchItem(rid, "", tuple(p), True)])
        core.allocate(op(), sid, "p", [(rid, len(p) - m.results[0].cached_tokens)])
        core.cache_requests(op(), sid, "p", [CacheItem(rid, tuple(p), True)])
    return prompts


def timed(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    rng = random.Random(0)
    core = CacheCore(lease_seconds=3600)
    core.register_pool(op(), "p", 1, [Member("w0", "e", CAPACITY)])
    sid = core.open_session("bench").session_id
    prompts = fill(core, sid, rng)
    print(f"tree: {core.pool_status('p')[0].counters.cached} cached tokens")

    running = grpc_server.start(lambda s: cache_pb2_grpc.add_CacheServicer_to_server(CacheServicer(core), s),
                                [SERVICE_NAME], "127.0.0.1:0")
    stub = cache_pb2_grpc.CacheStub(grpc_server.channel(f"127.0.0.1:{running.port}"))
    query = prompts[7][:1900] + [1, 2, 3] + [rng.randrange(50_000) for _ in range(97)]
    n = iter(range(10**9))

    def match_inproc() -> None:
        rid = f"m{next(n)}"
        core.match(op(), sid, "p", [MatchItem(rid, "", tuple(query), True, 1999)])
        core.release_requests(op(), sid, "p", [rid])

    def match_grpc() -> None:
        rid = f"m{next(n)}"
        stub.Match(cache_pb2.MatchRequest(op_id=op(), session_id=sid, pool_id="p", items=[
            cache_pb2.MatchItem(request_id=rid, token_ids=query, lock=True, max_match_tokens=1999)]))
        core.release_requests(op(), sid, "p", [rid])

    decoders = [f"d{i}" for i in range(256)]
    core.match(op(), sid, "p", [MatchItem(r, "", (i,), True) for i, r in enumerate(decoders)])
    decode_items = [(r, 1) for r in decoders]
    decode_pb = [cache_pb2.AllocItem(request_id=r, num_tokens=1) for r in decoders]

    def decode_inproc() -> None:
        core.allocate(op(), sid, "p", decode_items)

    def decode_grpc() -> None:
        stub.Allocate(cache_pb2.AllocateRequest(op_id=op(), session_id=sid, pool_id="p", items=decode_pb))

    print(f"match+lock 2000-token prompt, 100k-token tree: in-process {timed(match_inproc, args.repeat):8.0f} us"
          f"   gRPC {timed(match_grpc, args.repeat):8.0f} us")
    print(f"decode allocation, 256 requests:              in-process {timed(decode_inproc, args.repeat):8.0f} us"
          f"   gRPC {timed(decode_grpc, args.repeat):8.0f} us")

    def evict_inproc() -> None:
        core.evict(op(), "p", 10_000)

    def evict_grpc() -> None:
        stub.Evict(cache_pb2.EvictRequest(op_id=op(), pool_id="p", num_tokens=10_000))

    rounds = max(1, min(args.repeat, 4))
    ev_in = timed(evict_inproc, rounds)
    core.release_requests(op(), sid, "p", decoders)
    fill(core, sid, random.Random(1))
    ev_grpc = timed(evict_grpc, rounds)
    print(f"evict 10,000 tokens:                          in-process {ev_in:8.0f} us   gRPC {ev_grpc:8.0f} us")
    assert core.check_integrity("p") == []
    running.server.stop(0)


if __name__ == "__main__":
    main()
