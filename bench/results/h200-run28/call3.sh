#!/bin/bash
# Run 28 call 3 (session 28; carry [".whl", ".jit", ".baseline"]): (1) the GPU tests of the committed tree (the plan
# ring: test_plan_ring.py, test_gpu.py's ring / chained / graph / multi-step cases), (2) gpu_untested.patch applied
# (its raw_logits now under inference_mode: run 28 call 1's 12 failures) and its tests, (3) the worker bench at B = 1 /
# 64 / 256, K = 8: patched, committed (ring), 4bbeb33's worker (.baseline).
mkdir -p /tmp/r; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T="graph or multistep or mqa or chained or ring or plan"
timeout 90 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py tests/worker/test_plan_ring.py -k "$T" \
  > /tmp/r/tests_ring.txt 2>&1; tail -5 /tmp/r/tests_ring.txt; pack; echo "ring tests after $(( $(date +%s) - TS )) s"
rm -rf /tmp/ring && mkdir /tmp/ring && tar cf - --exclude=./.whl --exclude=./.jit --exclude=./.baseline --exclude=./bench/results . \
  | tar xf - -C /tmp/ring
rm -rf /tmp/base && mkdir /tmp/base && tar cf - --exclude=./.whl --exclude=./.jit --exclude=./.baseline --exclude=./bench/results . \
  | tar xf - -C /tmp/base && cp -r .baseline/worker_svc/. /tmp/base/worker_svc/
git apply bench/results/h200-run27/gpu_untested.patch && echo "patch applied" || echo "PATCH FAILED"
timeout 100 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py tests/worker/test_plan_ring.py -k "$T" \
  "tests/worker/test_gpu_fused.py::test_greedy_pick_on_the_gpu_is_torchs_argmax" \
  "tests/worker/test_gpu_fused.py::test_served_model_with_fused_kernels_decodes_as_without" > /tmp/r/tests_patch.txt 2>&1
tail -6 /tmp/r/tests_patch.txt; pack; echo "patch tests after $(( $(date +%s) - TS )) s"
W() { n=$1; dir=$2; lim=$3; shift 3; ok $lim || return; (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 70 python3 -m worker_svc.bench \
  --shape starcoderbase-1b --dtype bfloat16 --decode-steps 8 --context 1152 --prefill "" --json-out /tmp/r/w_$n.json "$@" \
  > /tmp/r/w_$n.txt 2>&1); echo "$n:"; grep -E "K=8|replay alone|Error|error" /tmp/r/w_$n.txt | cut -c1-150; echo "  ($(( $(date +%s) - TS )) s)"; pack; }
W new $PWD 230 --batches 1,64,256
W ring /tmp/ring 270 --batches 1,64,256
W base /tmp/base 310 --batches 1,64,256
pack; echo "done after $(( $(date +%s) - TS )) s"
