#!/bin/bash
# Written in session 33 for session 34's first call (carry [".whl", ".jit"]: .jit holds the bf16 head_dim 64 and 128
# flashinfer kernels, 15 MB; prologue: pip install of .whl into /tmp/site, PYTHONPATH=/tmp/site:$PWD
# PYTHONUNBUFFERED=1 MAX_JOBS=16). Every target of issue 15 with the defaults (h200-run33/call1.sh with c64 and c256
# run three times their requests, --rounds 3: run 33 saw one arm's c256 move +-9% between runs of 256 requests), the
# GPU tests (test_gpu.py, both resident kernels' files), tiny. Each step guarded by the time left of the 600 s.
mkdir -p /tmp/r1; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r1 .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
W() { n=$1; shift; ok $1 || return; t=$2; shift 2; timeout $t python3 -m worker_svc.bench --dtype bfloat16 --decode-steps 8 \
  --json-out /tmp/r1/w_$n.json "$@" > /tmp/r1/w_$n.txt 2>&1; echo "$n after $(( $(date +%s) - TS )) s:"; grep -E "replay alone|prefill" /tmp/r1/w_$n.txt | cut -c1-200; }
W 1b 10 230 --shape starcoderbase-1b --context 1152 --batches 1,64,256 --prefill 1024,8192
pack
ok 250 && timeout 170 python3 -m bench.serve_bench --gpu --phases hf,c64,c256,c1 --c1-requests 5 --rounds 3 --hf-baselines static_compiled \
  --out /tmp/r1/serve > /tmp/r1/serve.txt 2>&1
kill_stack; rm -rf /tmp/r1/serve/logs; grep -E "c64:|c256:|c1:|static_compiled:" /tmp/r1/serve.txt | cut -c1-240
pack; echo "serve after $(( $(date +%s) - TS )) s"
ok 420 && timeout $(( 548 - $(date +%s) + TS )) python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py \
  tests/worker/test_gpu_resident_gemm.py tests/worker/test_gpu_resident_gemv.py > /tmp/r1/tests.txt 2>&1; tail -3 /tmp/r1/tests.txt
pack; echo "tests after $(( $(date +%s) - TS )) s"
W tiny 560 35 --shape tiny_starcoder_py --context 1152 --batches 1,8,32,64 --prefill 1024
pack; ls -la $OUT
echo "done after $(( $(date +%s) - TS )) s"
