#!/bin/bash
# H200 run 20 call 1 (carry [".whl", ".jit"]; prologue: pip install --no-index --no-deps --target /tmp/site .whl/*.whl
# && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; bash bench/results/h200-run20/call1.sh):
# (1) serve_bench 1B c64 --rounds 2, an extend launched behind the extend ahead (default) / at its turn
#     (--worker-flags=--no-extend-behind), alternated; the first run with --hop-trace: where the device's idle time
#     between two waves goes (bench/wave_report.py: the Forward timeline joined with every request's hops);
# (2) tests/worker/test_gpu_ragged.py (the prepared, now enqueued, eager extend on CUDA) after the first pair.
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
S() { n=$1; shift; timeout 150 python3 -m bench.serve_bench --gpu --phases c64 --rounds 2 --out /tmp/r/$n "$@" > /tmp/r/$n.txt 2>&1
  kill_stack; rm -rf /tmp/r/$n/logs; grep -E "c64:" /tmp/r/$n.txt | cut -c1-250
  python3 -m bench.forward_timeline /tmp/r/$n/forwards.tsv --json /tmp/r/fwd_$n.json > /tmp/r/fwd_$n.txt; grep -A8 "^segment 1" /tmp/r/fwd_$n.txt
  pack; echo "$n after $(( $(date +%s) - T0 )) s"; }
S behind1 --hop-trace /tmp/r/hops
python3 -m bench.wave_report /tmp/r/behind1/forwards.tsv /tmp/r/hops > /tmp/r/waves.txt; head -60 /tmp/r/waves.txt
python3 -m bench.hop_report /tmp/r/hops --last client_done > /tmp/r/hops.txt; cat /tmp/r/hops.txt
tar czf /tmp/r/hops.tgz -C /tmp/r hops && rm -rf /tmp/r/hops; pack
S turn1 --worker-flags=--no-extend-behind
timeout 140 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu_ragged.py 2>&1 | tail -4 | tee /tmp/r/test_gpu_ragged.txt
pkill -9 -f pytest; pack; echo "ragged tests after $(( $(date +%s) - T0 )) s"
left 440 && S behind2
left 440 && S turn2 --worker-flags=--no-extend-behind
echo "done after $(( $(date +%s) - T0 )) s"
