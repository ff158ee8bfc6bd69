#!/bin/bash
# H200 run 17 call 5: tests/worker/test_gpu.py on the final code (after the review fixes of launch behind).
mkdir -p /tmp/r
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
timeout 200 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py 2>&1 | tail -4 | tee $OUT/test_gpu.txt
