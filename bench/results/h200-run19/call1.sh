#!/bin/bash
# H200 run 19 call 1 (carry [".whl"], no JIT cache: built here, returned as $OUT/jit.part*): the extend prepared at
# arrival (worker_svc/extend_ahead.py, default) against --no-extend-ahead, and where the worker's host time goes.
# serve_bench 1B c256,c64 with the Forward timeline: ahead1 (builds the JIT cache), turn1 (--worker-flags=
# --no-extend-ahead), then spy_gil: py-spy (--gil --nonblocking, 250 Hz) on the worker and the scheduler from the
# gateway's start on (default flags), then ahead2 / turn2 while time is left.
# Prologue: pip install --target /tmp/site .whl/*.whl; PYTHONPATH=/tmp/site:$PWD.
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
if [ -d .jit ]; then cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"; else NOJIT=1; fi
[ -x /tmp/spy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy*.whl
nproc; lscpu | grep "Model name"; nvidia-smi --query-gpu=name --format=csv,noheader
S() { n=$1; spy=$2; who=$3; shift 3; mkdir -p /tmp/r/$n
  timeout 280 python3 -m bench.serve_bench --gpu --phases c256,c64 \
      --out /tmp/r/$n/sb "$@" > /tmp/r/$n/serve.txt 2>&1 &
  B=$!
  for i in $(seq 250); do grep -q "gateway ready" /tmp/r/$n/serve.txt 2>/dev/null && break; sleep 1; done
  echo "$n: gateway after $i s"
  for s in $who; do p=$(pgrep -f -- "-m $s" | head -1)
    [ -n "$p" ] && timeout 120 /tmp/spy/bin/py-spy record -p $p -d 100 -r 250 --nonblocking $spy -f raw \
        -o /tmp/r/$n/spy_$s.txt > /tmp/r/$n/spy_$s.log 2>&1 &
  done
  wait $B; kill_stack; sleep 2; pkill -INT -f py-spy; sleep 2; rm -rf /tmp/r/$n/sb/logs; gzip -f /tmp/r/$n/spy_*.txt
  grep -E "c64:|c256:|Error|error" /tmp/r/$n/serve.txt | cut -c1-330
  python3 -m bench.forward_timeline /tmp/r/$n/sb/forwards.tsv --json /tmp/r/$n/fwd.json > /tmp/r/$n/fwd.txt; grep -A12 "^segment [12]" /tmp/r/$n/fwd.txt
  pack; echo "$n after $(( $(date +%s) - T0 )) s"; }
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
S ahead1 "" ""
if [ -n "$NOJIT" ]; then (cd ~ && tar czf /tmp/jit.tgz $(ls -d .cache/flashinfer .cache/tvm-ffi .triton 2>/dev/null)); split -b 15000000 -d /tmp/jit.tgz $OUT/jit.part; ls -la $OUT; fi
S turn1 "" "" --worker-flags=--no-extend-ahead
left 400 && S spy_gil "--gil" "worker_svc scheduler_svc"
left 460 && S ahead2 "" ""
left 520 && S turn2 "" "" --worker-flags=--no-extend-ahead
echo "done after $(( $(date +%s) - T0 )) s"
