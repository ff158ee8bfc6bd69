#!/bin/bash
# H200 run 17 call 1: (1) tests/worker/test_gpu.py; (2) serve_bench (1B, c64 and c1) with the worker's Forward
# timeline (CODESERVE_FORWARD_LOG, worker_svc/forward_log.py) and its report (bench/forward_timeline.py): where the
# c64 phase's 1.8 s go between decode, extend and the gaps; (3) the editor (tiny, 20 typists, PSM, 15 s, hop trace)
# alternated: session 13's scheduler (--no-early-match, grpcio's EventEngine on) against the defaults (early Match,
# EventEngine off), twice.
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nproc; grep "model name" /proc/cpuinfo | head -1
timeout 240 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py 2>&1 | tail -4 | tee /tmp/r/test_gpu.txt
pkill -9 -f pytest; pack; echo "tests after $(( $(date +%s) - T0 )) s"
CODESERVE_FORWARD_LOG=/tmp/r/fwd.tsv timeout 200 python3 -m bench.serve_bench --gpu --phases c64,c1 --out /tmp/r/serve > /tmp/r/serve.txt 2>&1
kill_stack; rm -rf /tmp/r/serve/logs; grep -E "c64:|c1:" /tmp/r/serve.txt | cut -c1-400
python3 -m bench.forward_timeline /tmp/r/fwd.tsv --json /tmp/r/fwd_report.json | tee /tmp/r/fwd_report.txt
pack; echo "serve after $(( $(date +%s) - T0 )) s"
rm -rf /tmp/hops_*
E() { n=$1; label=$2; shift 2; timeout 70 python3 -m bench.editor_bench --gpu --context-files 4 --modes psm --duration 15 --typists 20 \
        --hop-trace /tmp/hops_$n --out /tmp/r/ed_$n "$@" > /tmp/r/editor_$n.txt 2>&1; kill_stack; rm -rf /tmp/r/ed_$n/logs
      python3 -m bench.hop_report /tmp/hops_$n > /tmp/r/ed_$n/hops.txt; echo "[$label] $(tail -1 /tmp/r/editor_$n.txt | cut -c1-250)"
      grep -E "generate ->|taken ->|match_sent ->|forward_out|total" /tmp/r/ed_$n/hops.txt; echo "editor $n after $(( $(date +%s) - T0 )) s"; pack; }
export CODESERVE_SWITCH_INTERVAL_US=100
for i in 1 2; do
  GRPC_EXPERIMENTS="" E base$i base --scheduler-flags=--no-early-match
  E new$i new
done
echo "done after $(( $(date +%s) - T0 )) s"
