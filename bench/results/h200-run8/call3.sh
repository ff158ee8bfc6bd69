#!/bin/bash
# H200 run 8, call 3: session 5's scheduler changes A/B on the editor workload (20 typists, PSM): the default, then
# --no-adaptive-steps, --no-chain-admissions, --no-chunk-pipeline, and the last two off together (on the 2-core CPU
# box the two together cost ~10 ms of TTFT p50 at 8 typists: decide the defaults on these figures). serve_bench's
# A/B of the same is call4.sh.
# Same carry and prologue as call1.sh: bash bench/results/h200-run8/call3.sh > $OUT/log.txt 2>&1
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d ~/.cache/flashinfer ] || { cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"; }
[ -d /tmp/mtiny ] || python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
[ -d /tmp/codeserve-bench-model ] || python3 -m worker_svc.model.default --shape starcoderbase-1b --dtype bfloat16 --device cuda --out /tmp/codeserve-bench-model > /dev/null
echo "ready after $(( $(date +%s) - T0 )) s"
E() { timeout 85 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm --duration 20 --typists 20 --scheduler-flags="$2" --hop-trace /tmp/hops_$1 --out /tmp/ed_$1 > $OUT/editor_$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; mkdir -p /tmp/r/ed_$1; cp /tmp/ed_$1/editor_*.json /tmp/r/ed_$1/; }
E adaptive ""
E fixedk "--no-adaptive-steps"
E nochain "--no-chain-admissions"
E nopipe "--no-chunk-pipeline"
E neither "--no-chain-admissions --no-chunk-pipeline"
echo "editor after $(( $(date +%s) - T0 )) s"
tar czf $OUT/json.tgz -C /tmp/r .
