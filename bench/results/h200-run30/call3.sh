#!/bin/bash
# Session 30 call 3 (carry [".whl", ".jit2"]; prologue as call 1): the wide-Forward lead (--launch-lead-wide-steps 1,
# the new default: behind a decode Forward of more than 64 rows the next one starts its launch two steps before the
# end) against 0 (one step at every width, as before), c256 alternated twice (a device budget of ~250 s).
mkdir -p /tmp/r; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
AB() { name=$1; ok $2 || return; shift 2; timeout 60 python3 -m bench.serve_bench --gpu --phases c256 --out /tmp/r/$name "$@" > /tmp/r/$name.txt 2>&1
  kill_stack; rm -rf /tmp/r/$name/logs; echo "== $name $*"; grep -E "c256:" /tmp/r/$name.txt | cut -c24-200
  python3 -m bench.forward_timeline /tmp/r/$name/forwards.tsv 2>&1 | grep -E "^segment|gap decode->decode" | head -4; pack; }
AB wide1 100; AB same1 130 --worker-flags=--launch-lead-wide-steps=0; AB wide2 160; AB same2 160 --worker-flags=--launch-lead-wide-steps=0
pack; echo "done after $(( $(date +%s) - TS )) s"
