#!/bin/bash
# For the next session (carry [".whl", ".jit"]; prologue as call2.sh; ~4 min): the GPU tests after run 25's changes in
# full (the tiny model's split-K limit of 16 rows: test_gpu_whole_graph's served tokens cover it; the removal of the
# L2-prefetch / early-tile / budget experiments).
mkdir -p /tmp/r
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 500 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py tests/worker/test_gpu_whole_graph.py \
  tests/worker/test_gpu_fused.py tests/worker/test_gpu_skinny_gemm.py > /tmp/r/tests.txt 2>&1; tail -5 /tmp/r/tests.txt
cp /tmp/r/tests.txt $OUT/
