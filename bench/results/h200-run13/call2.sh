#!/bin/bash
# H200 run 13, call 2: the worker's new --prepare-ahead end to end, A/B in one call. (1) the editor (tiny, 20
# typists, PSM, 15 s, hop trace) with it and without it (call 1's editor ran behind a pytest killed by its timeout,
# whose processes were still running: 41.8 ms); (2) serve_bench 1B c64,c1 without it, then hf,c64,c1 with it and
# transformers' compiled static generate as the baseline. Carry [".whl", ".jit"].
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
E() { n=$1; shift; timeout 62 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm \
        --duration 15 --typists 20 --hop-trace /tmp/hops_$n --out /tmp/ed_$n "$@" > /tmp/r/editor_$n.txt 2>&1; kill_stack
      mkdir -p /tmp/r/ed_$n; cp /tmp/ed_$n/*.json /tmp/r/ed_$n/ 2>/dev/null; python3 -m bench.hop_report /tmp/hops_$n > /tmp/r/ed_$n/hops.txt
      tail -1 /tmp/r/editor_$n.txt | cut -c1-260; grep -E "forward|total" /tmp/r/ed_$n/hops.txt; echo "editor $n after $(( $(date +%s) - T0 )) s"; pack; }
E ahead
E atlaunch --worker-flags=--no-prepare-ahead
S() { n=$1; t=$2; shift 2; timeout $t python3 -m bench.serve_bench --gpu --out /tmp/sb_$n "$@" > /tmp/r/serve_$n.txt 2>&1; kill_stack
      cp /tmp/sb_$n/serve_bench.json /tmp/r/serve_$n.json 2>/dev/null; grep -iE "^phase|c64|c1 |tok/s|ttft" /tmp/r/serve_$n.txt | head -12
      echo "serve $n after $(( $(date +%s) - T0 )) s"; pack; }
left 250 && S atlaunch 100 --phases c64,c1 --worker-flags=--no-prepare-ahead
left 360 && S ahead 170 --phases hf,c64,c1 --hf-baselines static_compiled
echo "done after $(( $(date +%s) - T0 )) s"
