"""The cache service's CPU per keystroke completion (not a test): the operations the scheduler sends for each of a
typist's requests, through the real CacheServicer in process (protobuf in and out, no transport).

    python -m bench.keystroke_cache_cost [--typists 20] [--keystrokes 60] [--prompt-len 1700] [--json PATH]

Each typist has a file (``prompt-len`` tokens before the cursor, 100 after it); per keystroke one token is typed
before the tail and the request runs the cache's part of its life: Match (lock, first chunk allocated), the
insert at the end of its prefill (CacheRequests finished=false), one decode Allocate of 16 tokens, the insert at
its finish (CacheRequests finished=true). Each keystroke adds a node to the typist's path in the radix tree, so
the path is ``keystrokes`` nodes deep by the end. Prints microseconds per operation (mean over every request).
"""

from __future__ import annotations

import argparse
import json
import random
import time
import uuid

from cache_svc.core import CacheCore
from cache_svc.items import Member
from cache_svc.service import CacheServicer
from codeserve.v1 import cache_pb2


class _Context:
    def abort(self, code, details):
        raise RuntimeError(f"{code}: {details}")


def run(typists: int, keystrokes: int, prompt_len: int) -> dict:
    """{operation: mean microseconds} over ``typists * keystrokes`` requests, and the settings."""
    core = CacheCore()
    sid = core.open_session("bench").session_id
    core.register_pool(uuid.uuid4().hex, "default", 1, [Member("w", "e", 2_000_000)], sid)
    svc, ctx, rng = CacheServicer(core), _Context(), random.Random(0)
    heads = [[rng.randrange(100, 1000) for _ in range(prompt_len)] for _ in range(typists)]
    tails = [[rng.randrange(100, 1000) for _ in range(100)] for _ in range(typists)]
    spent = {"match": 0.0, "cache_prefill": 0.0, "allocate": 0.0, "cache_finish": 0.0}
    n = 0
    for _ in range(keystrokes):
        for t in range(typists):
            heads[t].append(rng.randrange(100, 1000))
            ids, rid = heads[t] + tails[t], f"r{n}"
            n += 1
            t0 = time.perf_counter()
            svc.Match(cache_pb2.MatchRequest(op_id=uuid.uuid4().hex, session_id=sid, pool_id="default", items=[
                cache_pb2.MatchItem(request_id=rid, token_ids=ids, lock=True, max_match_tokens=len(ids) - 1,
                                    allocate_up_to=8192, compute_tokens=len(ids))]), ctx)
            t1 = time.perf_counter()
            svc.CacheRequests(cache_pb2.CacheRequestsRequest(op_id=uuid.uuid4().hex, session_id=sid, pool_id="default",
                                                             items=[cache_pb2.CacheItem(request_id=rid, token_ids=ids)]), ctx)
            t2 = time.perf_counter()
            svc.Allocate(cache_pb2.AllocateRequest(op_id=uuid.uuid4().hex, session_id=sid, pool_id="default",
                                                   items=[cache_pb2.AllocItem(request_id=rid, num_tokens=16)]), ctx)
            t3 = time.perf_counter()
            svc.CacheRequests(cache_pb2.CacheRequestsRequest(
                op_id=uuid.uuid4().hex, session_id=sid, pool_id="default",
                items=[cache_pb2.CacheItem(request_id=rid, token_ids=ids + [77] * 15, finished=True)]), ctx)
            t4 = time.perf_counter()
            for key, dt in zip(spent, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                spent[key] += dt
    out = {f"{k}_us": v / n * 1e6 for k, v in spent.items()}
    out["total_us"] = sum(spent.values()) / n * 1e6
    return {"typists": typists, "keystrokes": keystrokes, "prompt_len": prompt_len, "requests": n, **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--typists", type=int, default=20)
    ap.add_argument("--keystrokes", type=int, default=60)
    ap.add_argument("--prompt-len", type=int, default=1700)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    figures = run(a.typists, a.keystrokes, a.prompt_len)
    print("  ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
