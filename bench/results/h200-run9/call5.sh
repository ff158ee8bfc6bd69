#!/bin/bash
# H200 run 9, call 5: the editor workload (20 typists, PSM, 15 s, tiny model) with the served default of call 4's
# change (split-K + PDL for the tiny shape) against the worker's --splitk-rows 0 --no-pdl, alternated.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
E() { timeout 50 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm --duration 15 --typists 20 --worker-flags="$2" --out /tmp/ed_$1 > /tmp/r/editor_$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; mkdir -p /tmp/r/ed_$1; cp /tmp/ed_$1/editor_*.json /tmp/r/ed_$1/; tar czf $OUT/json.tgz -C /tmp/r .; }
E splitk1 ""; E cublas1 "--splitk-rows 0 --no-pdl"; E splitk2 ""; E cublas2 "--splitk-rows 0 --no-pdl"
echo "editor after $(( $(date +%s) - T0 )) s"
