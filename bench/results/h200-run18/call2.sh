#!/bin/bash
# H200 run 18 call 2: the 1B's decode graphs over 64 rows with the Triton decode attention (launch behind possible)
# against the default (flashinfer for buckets over 64 rows: a host plan per step, no launch behind). serve_bench 1B
# c256,c64 with the Forward timeline, default / --worker-flags=--decode-attention=triton alternated.
# The JIT cache (call 1's did not come back: tar of a missing path) is packed after the first run as $OUT/jit.part*.
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
if [ -d .jit ]; then cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"; else NOJIT=1; fi
S() { n=$1; shift; timeout 300 python3 -m bench.serve_bench --gpu --phases c256,c64 --out /tmp/r/serve_$n "$@" > /tmp/r/serve_$n.txt 2>&1
      kill_stack; rm -rf /tmp/r/serve_$n/logs
      echo "[$n]"; grep -E "c64:|c256:|Error|error" /tmp/r/serve_$n.txt | cut -c1-300
      python3 -m bench.forward_timeline /tmp/r/serve_$n/forwards.tsv --json /tmp/r/fwd_$n.json > /tmp/r/fwd_$n.txt; grep -A9 "^segment [12]" /tmp/r/fwd_$n.txt; pack
      echo "$n after $(( $(date +%s) - T0 )) s"; }
S default1
if [ -n "$NOJIT" ]; then ls -d ~/.cache/* ~/.triton 2>&1; du -sh ~/.cache/* ~/.triton 2>/dev/null
  (cd ~ && tar czf /tmp/jit.tgz $(ls -d .cache/flashinfer .cache/tvm-ffi .triton 2>/dev/null)); split -b 15000000 -d /tmp/jit.tgz $OUT/jit.part; ls -la $OUT; fi
S triton1 --worker-flags=--decode-attention=triton
left 430 && S default2
left 500 && S triton2 --worker-flags=--decode-attention=triton
echo "done after $(( $(date +%s) - T0 )) s"
