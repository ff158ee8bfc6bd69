#!/bin/bash
# H200 run 8, call 6: adaptive decode steps with the worker's fixed cost (ForwardResponse.device_seconds,
# scheduler_svc/step_budget.py) against --no-adaptive-steps on the editor workload (20 typists, PSM, 15 s), three
# times each, alternated (call 3's single runs differed by more than the effect); the GPU tests first (the step
# clock's CUDA events are new). Same carry and prologue as call1.sh.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
echo "ready after $(( $(date +%s) - T0 )) s"
timeout 100 python3 -m pytest -o addopts="" -q -x tests/worker/test_gpu.py 2>&1 | grep -v "Warning\|warnings.warn" | tail -5 > $OUT/tests.txt
echo "tests after $(( $(date +%s) - T0 )) s"
E() { timeout 60 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm --duration 15 --typists 20 --scheduler-flags="$2" --out /tmp/ed_$1 > $OUT/editor_$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; mkdir -p /tmp/r/ed_$1; cp /tmp/ed_$1/editor_*.json /tmp/r/ed_$1/
      grep loop_stats /tmp/ed_$1/logs/scheduler.log | tail -1 > /tmp/r/ed_$1/loop_stats.json; }
for i in 1 2 3; do E adaptive$i ""; E fixedk$i "--no-adaptive-steps"; done
echo "editor after $(( $(date +%s) - T0 )) s"
tar czf $OUT/json.tgz -C /tmp/r .
