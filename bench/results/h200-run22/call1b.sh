#!/bin/bash
# H200 run 22 call 1b (the session's device time nearly spent on failed starts: the part of call1.sh that needs no
# JIT cache; carry [".whl"]; prologue as call1.sh): the cuBLASLt survey of the 1B and tiny shapes, then the
# candidate tests of tests/worker/test_gpu_cublaslt.py (no flashinfer kernel needed).
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
for s in starcoderbase-1b tiny_starcoder_py; do  # the 1B first: the one the B = 64 target is about
  timeout 100 python3 -m bench.cublaslt_bench --shape $s --rows 1,64,256 --out /tmp/r/lt_$s > /tmp/r/lt_$s.txt 2>&1
  grep -v Warn /tmp/r/lt_$s.txt | tail -20; pack; echo "$s after $(( $(date +%s) - T0 )) s"
done
timeout 100 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu_cublaslt.py -k "candidate" > /tmp/r/test_lt.txt 2>&1
tail -6 /tmp/r/test_lt.txt; pack; echo "done after $(( $(date +%s) - T0 )) s"
