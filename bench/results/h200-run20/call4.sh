#!/bin/bash
# H200 run 20 call 4 (carry [".whl", ".jit"]; prologue as call 1; ~500 s of the session's device time left after
# failed starts): (1) the engine-level tests of tests/worker/test_gpu_ragged.py (eager extends of fresh prompts:
# prepared at arrival, now enqueued in two parts and launched behind one another; ragged == paged, served tokens with
# the ragged path on and off, chunked, against transformers fp32); (2) one serve_bench 1B c64 --rounds 2 pair,
# extend launched behind (default) / at its turn, while time is left.
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 110 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu_ragged.py \
  -k "forward_on_the_ragged or served_greedy or mixing or hf_fp32" 2>&1 | tail -4 | tee /tmp/r/test_gpu_ragged.txt
pkill -9 -f pytest; pack; echo "tests after $(( $(date +%s) - T0 )) s"
S() { n=$1; shift; timeout 60 python3 -m bench.serve_bench --gpu --phases c64 --rounds 2 --out /tmp/r/$n "$@" > /tmp/r/$n.txt 2>&1
  kill_stack; rm -rf /tmp/r/$n/logs; grep -E "c64:" /tmp/r/$n.txt | cut -c1-200
  python3 -m bench.forward_timeline /tmp/r/$n/forwards.tsv > /tmp/r/fwd_$n.txt; grep -A8 "^segment 1" /tmp/r/fwd_$n.txt
  pack; echo "$n after $(( $(date +%s) - T0 )) s"; }
left 120 && S behind1
left 175 && S turn1 --worker-flags=--no-extend-behind
echo "done after $(( $(date +%s) - T0 )) s"
