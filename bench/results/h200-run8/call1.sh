#!/bin/bash
# H200 run 8, call 1 (prepared in sessions 4 and 5, which had no device time): GPU tests first (worker_svc/engine.py
# changed in session 4: releases carried by a Forward); the editor workload at 1 and 20 typists, PSM and SPM, with
# each service's CPU ms per request and the hop-by-hop table of a keystroke's TTFT (--hop-trace, "hops" in the
# JSON). serve_bench (c64 with and without the chunk pipeline) is call2.sh.
# Carry [".whl", ".jit"]; run: pip install ... && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MAX_JOBS=16;
#   bash bench/results/h200-run8/call1.sh > $OUT/log.txt 2>&1
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} + # ninja: the restored JIT builds are newer
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
W() { python3 -m worker_svc.bench --shape $1 --batches 1 --prefill 16 --iters 1 --cuda-graph-max-batch 1 --extend-graph-max-tokens 0 > /dev/null 2>&1; }
W starcoderbase-1b & W tiny_starcoder_py &
python3 -m worker_svc.model.default --shape starcoderbase-1b --dtype bfloat16 --device cuda --out /tmp/codeserve-bench-model > /dev/null &
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
wait; echo "warm after $(( $(date +%s) - T0 )) s"
timeout 200 python3 -m pytest -o addopts="" -q -x tests/worker/test_gpu.py tests/worker/test_gpu_fused.py 2>&1 | grep -v "Warning\|warnings.warn" | tail -25 > $OUT/tests.txt
echo "tests after $(( $(date +%s) - T0 )) s"
E() { timeout 130 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm,spm --duration 20 --typists $1 --hop-trace /tmp/hops$1 --out /tmp/ed$1 > $OUT/editor$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; mkdir -p /tmp/r/ed$1; cp /tmp/ed$1/editor_*.json /tmp/r/ed$1/
      tail -c 30000 /tmp/ed$1/logs/scheduler.log > /tmp/r/ed$1/scheduler.log; }
E 1
E 20
echo "editor after $(( $(date +%s) - T0 )) s"
tar czf $OUT/json.tgz -C /tmp/r .
