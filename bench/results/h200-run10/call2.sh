#!/bin/bash
# H200 run 10, call 2 (prepared in session 7): end to end with session 7's changes (StepFeed of the whole Forward,
# PDL, split-K for the tiny shape, arrivals admitted while extends ahead run): serve_bench on the 1B shape
# (hf,c64,c256,c1 with transformers' compiled static generate in the same run), then the editor workload (tiny,
# 20 typists, PSM, 15 s) three times, and once with the worker's --splitk-rows 0 --no-pdl. Same carry and
# prologue as call1.sh; results packed into $OUT/json.tgz.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
timeout 330 python3 -m bench.serve_bench --gpu --out /tmp/sb --phases hf,c64,c256,c1 --hf-baselines static_compiled > /tmp/r/serve.txt 2>&1
cp /tmp/sb/serve_bench.json /tmp/sb/serve_bench_table.txt /tmp/r/ 2>/dev/null; tar czf $OUT/json.tgz -C /tmp/r .
echo "serve after $(( $(date +%s) - T0 )) s"
E() { timeout 50 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm --duration 15 --typists 20 --worker-flags="$2" --out /tmp/ed_$1 > /tmp/r/editor_$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; mkdir -p /tmp/r/ed_$1; cp /tmp/ed_$1/editor_*.json /tmp/r/ed_$1/
      grep loop_stats /tmp/ed_$1/logs/scheduler.log | tail -1 > /tmp/r/ed_$1/loop_stats.json; tar czf $OUT/json.tgz -C /tmp/r .; }
E default1 ""; E cublas1 "--splitk-rows 0 --no-pdl"; E default2 ""; E default3 ""
echo "editor after $(( $(date +%s) - T0 )) s"
