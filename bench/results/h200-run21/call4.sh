#!/bin/bash
# H200 run 21 call 4 (carry [".whl", ".jit"]; prologue as call 1; ~285 s of device time left): serve_bench 1B c64
# --rounds 2, the first decode chained behind the extend that ends every prefill (default) / after its reply
# (--scheduler-flags=--no-chain-after-extend), alternated while time is left.
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name --format=csv,noheader
S() { n=$1; shift; timeout 60 python3 -m bench.serve_bench --gpu --phases c64 --rounds 2 --out /tmp/r/$n "$@" > /tmp/r/$n.txt 2>&1
  kill_stack; rm -rf /tmp/r/$n/logs; grep -E "c64:" /tmp/r/$n.txt | cut -c1-160; grep -o '"decode_after_extend": [0-9]*' /tmp/r/$n.txt | tail -1
  python3 -m bench.forward_timeline /tmp/r/$n/forwards.tsv --json /tmp/r/fwd_$n.json > /tmp/r/fwd_$n.txt; grep -A8 "^segment 1" /tmp/r/fwd_$n.txt
  pack; echo "$n after $(( $(date +%s) - T0 )) s"; }
S after1
left 150 && S sync1 --scheduler-flags=--no-chain-after-extend
left 180 && S after2
left 200 && S sync2 --scheduler-flags=--no-chain-after-extend
echo "done after $(( $(date +%s) - T0 )) s"
