#!/bin/bash
# Session 33, first call (written in session 32 as h200-run32/call5.sh; the carried .jit now holds bf16 head_dim 64 and 128 flashinfer kernels). Every target of
# issue 15 with the defaults of session 32 (the resident GEMV with the looping grid at 2 CTAs an SM for the 1B's
# 33.5 MB projections; the resident GEMM on tiny-sized models at 5-32 rows) and the GPU tests with them (test_gpu.py
# has not run with the resident GEMM on by default). No JIT cache is carried: the order puts each head dim's build
# first where it is needed anyway (the 1B worker bench builds head_dim 128's flashinfer kernels, ~150 s cold on the
# H100 in session 32; the tests build 64's, which tiny shares), each step guarded by the time left of the 600 s.
# Carry [".whl"]; prologue: pip install of .whl into /tmp/site, PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# MAX_JOBS=16. The JIT cache goes to $OUT/jit.part* at the end (carry it as .jit for call6.sh on a fresh machine).
mkdir -p /tmp/r5; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r5 .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
W() { n=$1; shift; ok $1 || return; t=$2; shift 2; timeout $t python3 -m worker_svc.bench --dtype bfloat16 --decode-steps 8 \
  --json-out /tmp/r5/w_$n.json "$@" > /tmp/r5/w_$n.txt 2>&1; echo "$n after $(( $(date +%s) - TS )) s:"; grep -E "replay alone|prefill" /tmp/r5/w_$n.txt | cut -c1-200; }
W 1b 10 230 --shape starcoderbase-1b --context 1152 --batches 1,64,256 --prefill 1024,8192
pack
ok 250 && timeout 140 python3 -m bench.serve_bench --gpu --phases hf,c64,c256,c1 --c1-requests 5 --hf-baselines static_compiled \
  --out /tmp/r5/serve > /tmp/r5/serve.txt 2>&1
kill_stack; rm -rf /tmp/r5/serve/logs; grep -E "c64:|c256:|c1:|static_compiled:" /tmp/r5/serve.txt | cut -c1-240
pack; echo "serve after $(( $(date +%s) - TS )) s"
ok 400 && timeout $(( 548 - $(date +%s) + TS )) python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py \
  tests/worker/test_gpu_resident_gemm.py tests/worker/test_gpu_resident_gemv.py > /tmp/r5/tests.txt 2>&1; tail -3 /tmp/r5/tests.txt
pack; echo "tests after $(( $(date +%s) - TS )) s"
W tiny 550 40 --shape tiny_starcoder_py --context 1152 --batches 1,8,32,64 --prefill 1024
timeout 8 bash -c "tar czf - -C ~ .cache/flashinfer .triton 2>/dev/null | split -b 15M - $OUT/jit.part"; pack; ls -la $OUT
echo "done after $(( $(date +%s) - TS )) s"
