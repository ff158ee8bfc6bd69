#!/bin/bash
# Run 27 call 6 (session 27; carry [".whl", ".jit", ".baseline"]), the first call of a machine that is not an H200: all five
# GPU test files (test_gpu.py: graph == eager through the new greedy pick and K/V write; whole graph, fused, skinny GEMM,
# extend behind), then the worker bench of this tree against 4bbeb33 (.baseline) at B = 1 / 64 / 256, K = 8, and the
# Triton attention at every bucket (--decode-attention triton) at B = 64 / 256.
mkdir -p /tmp/r; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 330 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py tests/worker/test_gpu_whole_graph.py tests/worker/test_gpu_fused.py \
  tests/worker/test_gpu_skinny_gemm.py tests/worker/test_gpu_extend_behind.py > /tmp/r/tests.txt 2>&1; tail -6 /tmp/r/tests.txt
pack; echo "tests after $(( $(date +%s) - TS )) s"
rm -rf /tmp/base && mkdir /tmp/base && tar cf - --exclude=./.whl --exclude=./.jit --exclude=./.baseline --exclude=./bench/results . \
  | tar xf - -C /tmp/base && rm -f /tmp/base/worker_svc/model/greedy.py && cp -r .baseline/worker_svc/. /tmp/base/worker_svc/
NEW=$PWD
W() { n=$1; dir=$2; lim=$3; shift 3; ok $lim || return; (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 100 python3 -m worker_svc.bench \
  --shape starcoderbase-1b --dtype bfloat16 --decode-steps 8 --context 1152 --prefill "" --json-out /tmp/r/w_$n.json "$@" \
  > /tmp/r/w_$n.txt 2>&1); echo "$n:"; grep -E "K=8|replay alone|Error|error" /tmp/r/w_$n.txt | cut -c1-150; echo "  ($(( $(date +%s) - TS )) s)"; pack; }
W new1 $NEW 460 --batches 1,64,256
W base1 /tmp/base 480 --batches 1,64,256
W tri1 $NEW 500 --batches 64,256 --decode-attention triton
pack; echo "done after $(( $(date +%s) - TS )) s"
