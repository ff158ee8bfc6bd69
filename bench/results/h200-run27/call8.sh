#!/bin/bash
# Run 27 call 8 (session 27; carry [".whl", ".jit", ".baseline"]; for the next session's first call too): applies
# gpu_untested.patch (the greedy pick inside the decode graphs, the K/V write in the Triton decode attention; out of
# the tree until its GPU tests pass), runs the GPU tests that cover it and the continuation extends, then the worker
# bench of the patched tree against 4bbeb33's worker (.baseline) at B = 1 / 64 / 256, K = 8. Session 28: the tests include
# the flashinfer buckets launched behind (the plan ring, attention/plan_ring.py): B = 256's chained line should launch behind.
mkdir -p /tmp/r; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
rm -rf /tmp/ring && mkdir /tmp/ring && tar cf - --exclude=./.whl --exclude=./.jit --exclude=./.baseline --exclude=./bench/results . \
  | tar xf - -C /tmp/ring  # this tree without the patch: the plan ring alone
git apply bench/results/h200-run27/gpu_untested.patch && echo "patch applied" || echo "PATCH FAILED"
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 110 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py tests/worker/test_plan_ring.py -k "graph or multistep or mqa or chained or ring or plan" \
  > /tmp/r/tests.txt 2>&1; tail -4 /tmp/r/tests.txt
timeout 80 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu_extend_behind.py \
  "tests/worker/test_gpu_fused.py::test_greedy_pick_on_the_gpu_is_torchs_argmax" \
  "tests/worker/test_gpu_fused.py::test_served_model_with_fused_kernels_decodes_as_without" > /tmp/r/tests2.txt 2>&1
tail -4 /tmp/r/tests2.txt; pack; echo "tests after $(( $(date +%s) - TS )) s"
rm -rf /tmp/base && mkdir /tmp/base && tar cf - --exclude=./.whl --exclude=./.jit --exclude=./.baseline --exclude=./bench/results . \
  | tar xf - -C /tmp/base && rm -f /tmp/base/worker_svc/model/greedy.py && cp -r .baseline/worker_svc/. /tmp/base/worker_svc/
NEW=$PWD
W() { n=$1; dir=$2; lim=$3; shift 3; ok $lim || return; (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 80 python3 -m worker_svc.bench \
  --shape starcoderbase-1b --dtype bfloat16 --decode-steps 8 --context 1152 --prefill "" --json-out /tmp/r/w_$n.json "$@" \
  > /tmp/r/w_$n.txt 2>&1); echo "$n:"; grep -E "K=8|replay alone|Error|error" /tmp/r/w_$n.txt | cut -c1-150; echo "  ($(( $(date +%s) - TS )) s)"; pack; }
W new1 $NEW 260 --batches 1,64,256
W ring1 /tmp/ring 330 --batches 1,64,256
W base1 /tmp/base 400 --batches 1,64,256
pack; echo "done after $(( $(date +%s) - TS )) s"
