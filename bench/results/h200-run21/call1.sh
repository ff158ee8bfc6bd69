#!/bin/bash
# H200 run 21 call 1 (carry [".whl", ".jit"]; prologue: pip install --no-index --no-deps --target /tmp/site .whl/*.whl
# && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; bash bench/results/h200-run21/call1.sh):
# (1) tests/worker/test_gpu_ragged.py whole (the prepared eager extend, launched behind the one ahead, on CUDA: no GPU
#     result yet); (2) serve_bench 1B c64 --rounds 3, extend launched behind (default) / at its turn
#     (--worker-flags=--no-extend-behind), alternated while time is left; the first with --hop-trace (the outbox fix of
#     session 18: a decode's messages go out as it is applied when nothing is chained behind it).
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; lscpu | grep "Model name"
timeout 230 python3 -m pytest -o addopts="" -q -p no:warnings -rf --durations=5 tests/worker/test_gpu_ragged.py > /tmp/r/test_gpu_ragged.txt 2>&1
tail -15 /tmp/r/test_gpu_ragged.txt; pkill -9 -f pytest; pack; echo "ragged tests after $(( $(date +%s) - T0 )) s"
S() { n=$1; shift; timeout 90 python3 -m bench.serve_bench --gpu --phases c64 --rounds 3 --out /tmp/r/$n "$@" > /tmp/r/$n.txt 2>&1
  kill_stack; rm -rf /tmp/r/$n/logs; grep -E "c64:" /tmp/r/$n.txt | cut -c1-250
  python3 -m bench.forward_timeline /tmp/r/$n/forwards.tsv --json /tmp/r/fwd_$n.json > /tmp/r/fwd_$n.txt; grep -A8 "^segment 1" /tmp/r/fwd_$n.txt
  pack; echo "$n after $(( $(date +%s) - T0 )) s"; }
S behind1 --hop-trace /tmp/r/hops
python3 -m bench.wave_report /tmp/r/behind1/forwards.tsv /tmp/r/hops > /tmp/r/waves.txt; head -40 /tmp/r/waves.txt
python3 -m bench.hop_report /tmp/r/hops --last client_done > /tmp/r/hops.txt; cat /tmp/r/hops.txt
tar czf /tmp/r/hops.tgz -C /tmp/r hops && rm -rf /tmp/r/hops; pack
left 500 && S turn1 --worker-flags=--no-extend-behind
left 500 && S behind2
left 500 && S turn2 --worker-flags=--no-extend-behind
echo "done after $(( $(date +%s) - T0 )) s"
