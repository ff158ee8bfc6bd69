#!/bin/bash
# H200 run 20 call 2 (carry [".whl", ".jit"]; prologue as call 1): (1) serve_bench 1B c64 --rounds 3, an extend
# launched behind the extend ahead (default; now also when it reached the worker before that one was enqueued:
# ForwardOrder.wait_launched) / at its turn (--worker-flags=--no-extend-behind), alternated; top sampled once a
# second during the first run (which process is busy: gateway, scheduler, worker, client); (2) test_gpu_ragged.py
# after the pair, in the 215 s left (the session's device time was nearly spent). The scheduler now lets a decode's messages go out as
# it is applied when nothing is chained behind it (both arms).
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; lscpu | grep "Model name"
S() { n=$1; shift; timeout 150 python3 -m bench.serve_bench --gpu --phases c64 --rounds 3 --out /tmp/r/$n "$@" > /tmp/r/$n.txt 2>&1
  kill_stack; rm -rf /tmp/r/$n/logs; grep -E "c64:" /tmp/r/$n.txt | cut -c1-250
  python3 -m bench.forward_timeline /tmp/r/$n/forwards.tsv --json /tmp/r/fwd_$n.json > /tmp/r/fwd_$n.txt; grep -A8 "^segment 1" /tmp/r/fwd_$n.txt
  pack; echo "$n after $(( $(date +%s) - T0 )) s"; }
( while [ ! -f /tmp/r/behind1/forwards.tsv ] || [ $(wc -l < /tmp/r/behind1/forwards.tsv) -lt 10 ]; do sleep 0.5; done
  top -b -d 1 -n 6 -c -w 250 | grep -E "^top|python" | cut -c1-220 > /tmp/r/top.txt ) &
S behind1
S turn1 --worker-flags=--no-extend-behind
timeout $(( 215 - $(date +%s) + T0 )) python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu_ragged.py 2>&1 | tail -4 | tee /tmp/r/test_gpu_ragged.txt
pkill -9 -f pytest; pack; echo "ragged tests after $(( $(date +%s) - T0 )) s"
echo "done after $(( $(date +%s) - T0 )) s"
