# Cross-process gRPC latencies against a real cache service: RenewSession, Match of 2 / 2,000 tokens, blocking and .future(), without and with a PollerKeeper.
import random, time, statistics, uuid, subprocess, sys, os
import grpc
from codeserve.v1 import cache_pb2, cache_pb2_grpc
from common import grpc_server
from common.poller_keeper import PollerKeeper
port = 50971
p = subprocess.Popen([sys.executable, "-m", "cache_svc", "--listen", f"127.0.0.1:{port}", "--log-level", "warning"])
time.sleep(3)
ch = grpc_server.channel(f"127.0.0.1:{port}")
stub = cache_pb2_grpc.CacheStub(ch)
op = lambda: uuid.uuid4().hex
stub.RegisterPool(cache_pb2.RegisterPoolRequest(op_id=op(), pool_id="p", page_size=1, members=[cache_pb2.PoolMember(worker_id="w", epoch="e", capacity_tokens=400000)]))
sid = stub.OpenSession(cache_pb2.OpenSessionRequest(owner="x", lease_seconds=3600)).session_id
rng = random.Random(0)
q = [rng.randrange(50000) for _ in range(2000)]
def med(f, r=300):
    s=[]
    for _ in range(r):
        t=time.perf_counter(); f(); s.append(time.perf_counter()-t)
    return round(statistics.median(s)*1e6)
n = iter(range(10**9))
def m(k, lock=False):
    stub.Match(cache_pb2.MatchRequest(op_id=op(), session_id=sid, pool_id="p", items=[cache_pb2.MatchItem(request_id=f"r{next(n)}", token_ids=q[:k], lock=lock)]))
for label in ("plain", "keeper"):
    if label == "keeper": kp = PollerKeeper(ch); time.sleep(0.5)
    print(label, "renew", med(lambda: stub.RenewSession(cache_pb2.RenewSessionRequest(session_id=sid))),
          "match2", med(lambda: m(2)), "match2000", med(lambda: m(2000)),
          "renew.future", med(lambda: stub.RenewSession.future(cache_pb2.RenewSessionRequest(session_id=sid)).result()))
p.terminate()
