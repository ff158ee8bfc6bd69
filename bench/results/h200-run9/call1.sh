#!/bin/bash
# H200 run 9, call 1 (prepared in session 6): under the adaptive-steps rule with the measured fixed cost, the editor
# workload's A/B of the chunk pipeline and the chain through admissions (run 8 call 3's single runs, under the first
# form of the rule, had --no-chunk-pipeline at 31.8 ms against 50.9 default), alternated twice on one machine; then
# serve_bench c1,c64 (the rule at c64). GPU tests first. Carry [".whl", ".jit"]; run:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null;
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MAX_JOBS=16; bash bench/results/h200-run9/call1.sh > $OUT/log.txt 2>&1
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
echo "ready after $(( $(date +%s) - T0 )) s"
timeout 150 python3 -m pytest -o addopts="" -q -x tests/worker/test_gpu.py tests/worker/test_gpu_fused.py 2>&1 | grep -v "Warning\|warnings.warn" | tail -5 > $OUT/tests.txt
echo "tests after $(( $(date +%s) - T0 )) s"
E() { timeout 60 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm --duration 15 --typists 20 --scheduler-flags="$2" --out /tmp/ed_$1 > $OUT/editor_$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; mkdir -p /tmp/r/ed_$1; cp /tmp/ed_$1/editor_*.json /tmp/r/ed_$1/
      grep loop_stats /tmp/ed_$1/logs/scheduler.log | tail -1 > /tmp/r/ed_$1/loop_stats.json; }
for i in 1 2; do E default$i ""; E nopipe$i "--no-chunk-pipeline"; E nochain$i "--no-chain-admissions"; done
echo "editor after $(( $(date +%s) - T0 )) s"
tar czf $OUT/json.tgz -C /tmp/r .
timeout 170 python3 -m bench.serve_bench --gpu --out /tmp/sb --phases c1,c64 > $OUT/serve.txt 2>&1
cp /tmp/sb/serve_bench.json /tmp/sb/serve_bench_table.txt /tmp/r/ 2>/dev/null
echo "serve after $(( $(date +%s) - T0 )) s"
tar czf $OUT/json.tgz -C /tmp/r .
