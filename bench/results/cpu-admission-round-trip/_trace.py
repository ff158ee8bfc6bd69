import time, sys, collections
T = {}
AGG = collections.defaultdict(list)
N = [0]
from common import _abs_trace
def mark(rid, label):
    _abs_trace.mark(rid, label)
    T.setdefault(rid, []).append((label, time.perf_counter()))
def done(rid):
    ev = T.pop(rid, None)
    if not ev: return
    t0 = ev[0][1]; prev = t0
    for lab, t in ev[1:]:
        AGG[lab].append((t - prev) * 1e3); prev = t
    AGG['total'].append((prev - t0) * 1e3)
    N[0] += 1
    if N[0] % 50 == 0:
        import statistics
        print('TRACE', {k: round(statistics.median(v), 3) for k, v in AGG.items()}, file=sys.stderr, flush=True)
