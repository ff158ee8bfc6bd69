# The Match RPC in process, step by step (request built, parsed, ids to a tuple, the core, the response built, serialized and parsed, release), on a 100k-token tree.
import random, time, statistics
from bench.cache_bench import fill, op, CAPACITY
from cache_svc.core import CacheCore
from cache_svc.items import Member, MatchItem
from cache_svc.service import CacheServicer, receipt_pb
from codeserve.v1 import cache_pb2
from common.proto_ints import as_tuple
rng = random.Random(0)
core = CacheCore(lease_seconds=3600)
core.register_pool(op(), "p", 1, [Member("w0", "e", CAPACITY)])
sid = core.open_session("bench").session_id
prompts = fill(core, sid, rng)
query = prompts[7][:1900] + [1, 2, 3] + [rng.randrange(50_000) for _ in range(97)]
n = iter(range(10**9))
T = {k: [] for k in "build parse astuple core resp ser release".split()}
for _ in range(400):
    rid = f"m{next(n)}"
    t0 = time.perf_counter()
    req = cache_pb2.MatchRequest(op_id=op(), session_id=sid, pool_id="p", items=[cache_pb2.MatchItem(request_id=rid, token_ids=query, lock=True, max_match_tokens=1999, allocate_up_to=128, compute_tokens=2000)])
    b = req.SerializeToString(); t1 = time.perf_counter()
    req = cache_pb2.MatchRequest.FromString(b); t2 = time.perf_counter()
    items = [MatchItem(i.request_id, i.namespace, as_tuple(i.token_ids), i.lock, i.max_match_tokens, i.allocate_up_to, i.compute_tokens) for i in req.items]
    t3 = time.perf_counter()
    out = core.match(req.op_id, req.session_id, req.pool_id, items); t4 = time.perf_counter()
    reply = cache_pb2.MatchResponse(receipt=receipt_pb(out.receipt), allocation=receipt_pb(out.allocation) if out.allocation is not None else None,
            results=[cache_pb2.MatchResult(request_id=r.request_id, cached_tokens=r.cached_tokens, slot_ids=r.slot_ids, allocated_slot_ids=r.allocated_slot_ids) for r in out.results])
    t5 = time.perf_counter()
    rb = reply.SerializeToString(); cache_pb2.MatchResponse.FromString(rb); t6 = time.perf_counter()
    core.release_requests(op(), sid, "p", [rid]); t7 = time.perf_counter()
    for k, a, z in zip(T, (t0,t1,t2,t3,t4,t5,t6), (t1,t2,t3,t4,t5,t6,t7)): T[k].append(z - a)
for k, v in T.items(): print(k, round(statistics.median(v) * 1e6, 1))
