#!/bin/bash
# H200 run 8, call 3: adaptive decode steps (session 5) A/B in one run: the editor workload at 20 typists with the
# default (adaptive) and with --no-adaptive-steps, then serve_bench c1 and c64 with and without (fixedk phase).
# Same carry and prologue as call1.sh: bash bench/results/h200-run8/call3.sh > $OUT/log.txt 2>&1
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d ~/.cache/flashinfer ] || { cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"; }
[ -d /tmp/mtiny ] || python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
[ -d /tmp/codeserve-bench-model ] || python3 -m worker_svc.model.default --shape starcoderbase-1b --dtype bfloat16 --device cuda --out /tmp/codeserve-bench-model > /dev/null
echo "ready after $(( $(date +%s) - T0 )) s"
E() { timeout 100 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm --duration 20 --typists 20 --scheduler-flags="$2" --hop-trace /tmp/hops_$1 --out /tmp/ed_$1 > $OUT/editor_$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; mkdir -p /tmp/r/ed_$1; cp /tmp/ed_$1/editor_*.json /tmp/r/ed_$1/; }
E adaptive ""
E fixedk "--no-adaptive-steps"
echo "editor after $(( $(date +%s) - T0 )) s"
timeout 300 python3 -m bench.serve_bench --gpu --shape starcoderbase-1b --model-dir /tmp/codeserve-bench-model --phases c1,c64,fixedk --out /tmp/sb3 > $OUT/serve.txt 2>&1
pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"
mkdir -p /tmp/r/sb3; cp /tmp/sb3/serve_bench*.json /tmp/sb3/serve_bench*table* /tmp/r/sb3/ 2>/dev/null
echo "serve after $(( $(date +%s) - T0 )) s"
tar czf $OUT/json.tgz -C /tmp/r .
