#!/bin/bash
# Session 29 call 3: py-spy (GIL-holding samples, per thread) of the worker and the scheduler during the c256 phase:
# where the ~9 ms worker preparation, ~9 ms finish-to-reply and ~22 ms scheduler cycle of a 256-row Forward go.
mkdir -p /tmp/r3; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} + 2>/dev/null
SPY=/tmp/site/bin/py-spy; ls -la $SPY
(timeout 200 python3 -m bench.serve_bench --gpu --phases c64,c256 --out /tmp/r3/serve > /tmp/r3/serve.txt 2>&1) &
for i in $(seq 1 1200); do grep -q "c64:" /tmp/r3/serve.txt 2>/dev/null && break; sleep 0.1; done
W=$(pgrep -f "m worker_svc" | head -1); S=$(pgrep -f "m scheduler_svc" | head -1); echo "worker $W scheduler $S"
ps -o pid,args -p $W,$S | cut -c1-150
$SPY record -p $W -r 400 -d 3 --gil --threads --format raw -o /tmp/r3/worker_gil.txt > /tmp/r3/spy_w.log 2>&1 &
$SPY record -p $S -r 400 -d 3 --gil --threads --format raw -o /tmp/r3/sched_gil.txt > /tmp/r3/spy_s.log 2>&1 &
wait
pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"
tail -3 /tmp/r3/spy_w.log /tmp/r3/spy_s.log
grep -E "c64:|c256:" /tmp/r3/serve.txt | cut -c1-200
python3 - <<'PY'
import collections
for name in ("worker_gil", "sched_gil"):
    try: lines = open(f"/tmp/r3/{name}.txt").read().splitlines()
    except OSError as e: print(name, e); continue
    own = collections.Counter(); incl = collections.Counter(); total = 0
    for ln in lines:
        stack, _, n = ln.rpartition(" "); n = int(n); total += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for f in set(frames): incl[f] += n
    print(f"== {name}: {total} samples")
    for f, n in own.most_common(25): print(f"  self {n:6d} {f[:150]}")
    for f, n in incl.most_common(45): print(f"  incl {n:6d} {f[:150]}")
PY
rm -rf /tmp/r3/serve/logs; tar czf $OUT/r3.tgz -C /tmp/r3 .
