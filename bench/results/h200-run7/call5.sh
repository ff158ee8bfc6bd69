#!/bin/bash
# H200 run 7, call 5: the editor workload's TTFT against the decode steps per Forward (an arrival's extend waits
# for the rest of the decode Forward in flight): 20 typists with --decode-steps 8 (the GPU default) and 2, and 1
# typist with 2 (tiny shape, PSM, --context-files 4, 15 s each), back to back.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
python3 -m worker_svc.bench --shape tiny_starcoder_py --batches 1 --prefill 16 --iters 1 --cuda-graph-max-batch 1 --extend-graph-max-tokens 0 > /dev/null 2>&1 &
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
wait; echo "warm after $(( $(date +%s) - T0 )) s"
E() { timeout 90 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm --duration 15 --typists $1 --decode-steps $2 --out /tmp/ed$1_$2 > $OUT/editor$1_$2.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway" ; mkdir -p /tmp/r/ed$1_$2; cp /tmp/ed$1_$2/editor_*.json /tmp/r/ed$1_$2/; tail -c 20000 /tmp/ed$1_$2/logs/scheduler.log > /tmp/r/ed$1_$2/scheduler.log; }
E 20 2
E 20 8
E 1 2
echo "editor after $(( $(date +%s) - T0 )) s"
tar czf $OUT/json.tgz -C /tmp/r .
