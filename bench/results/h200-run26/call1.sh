#!/bin/bash
# Run 26 call 1 (session 26; carry [".whl", ".jit", ".baseline"]; prologue: pip install of .whl into /tmp/site,
# PYTHONPATH=/tmp/site:$PWD): the scheduler's Generate streams on one grpc.aio event loop (this tree) against the
# threaded server (.baseline: scheduler_svc/ and common/ of 3c30075, laid over a copy of this tree in /tmp/base):
# c64 alternated twice, new first; then c64 with the gateway in 4 processes (--workers 4) on the new tree.
mkdir -p /tmp/r
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
rm -rf /tmp/base && mkdir /tmp/base && tar cf - --exclude=./.whl --exclude=./.jit --exclude=./.baseline --exclude=./bench/results . \
  | tar xf - -C /tmp/base && rm -rf /tmp/base/scheduler_svc /tmp/base/common && cp -r .baseline/scheduler_svc .baseline/common /tmp/base/
kill_stack  # a call that returned early may have left its stack running (run 26 call 2)
NEW=$PWD
S() { n=$1; dir=$2; shift 2; ok $(( ${LIMIT:-600} - 80 )) || return; (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 75 python3 -m bench.serve_bench --gpu \
  --phases c64 --out /tmp/r/$n "$@" > /tmp/r/$n.txt 2>&1); kill_stack; rm -rf /tmp/r/$n/logs
  echo "$n: $(grep -E 'c64:' /tmp/r/$n.txt | cut -c1-170)"; pack; }
S aio1 $NEW; S thr1 /tmp/base; S aio2 $NEW; S thr2 /tmp/base
S aio_w4 $NEW --gateway-flags=--workers=4
pack; echo "done after $(( $(date +%s) - TS )) s"
