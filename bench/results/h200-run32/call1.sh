#!/bin/bash
# Session 32 call 1 (was run31/call2.sh, not run in session 31). No JIT cache carried: the first worker start compiles it; packed to $OUT/jit.part* at the end. Every target of issue 15 with the
# defaults of 35202da (the resident-weight GEMV on: 1 row on the 1B, 4 on tiny), the GPU tests with that default,
# the looping grid for the 33.5 MB projections (worker bench --resident-stream 0 / 2 / 3 at B = 1, alternated),
# serve_bench hf,c64,c256,c1 (transformers' compiled static generate in the same run), worker bench 1B and tiny,
# c1 with the kernel off against on (--resident-rows=0). Carry [".whl"], prologue as run31/call1.sh without the .jit2 untar.
mkdir -p /tmp/r2; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r2 .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 170 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py tests/worker/test_gpu_resident_gemv.py \
  tests/worker/test_gpu_whole_graph.py tests/worker/test_gpu_extend_behind.py > /tmp/r2/tests.txt 2>&1; tail -3 /tmp/r2/tests.txt
pack; echo "tests after $(( $(date +%s) - TS )) s"
W() { n=$1; shift; ok $1 || return; shift; timeout 80 python3 -m worker_svc.bench --dtype bfloat16 --decode-steps 8 \
  --json-out /tmp/r2/w_$n.json "$@" > /tmp/r2/w_$n.txt 2>&1; echo "$n:"; grep -E "replay alone|prefill" /tmp/r2/w_$n.txt | cut -c1-200; }
for i in 1 2; do for st in 0 2 3; do  # the looping grid for the 16 MB+ projections (--resident-stream), B = 1
  W 1b_st${st}_$i 200 --shape starcoderbase-1b --context 1152 --batches 1 --prefill "" --resident-stream $st; done; done
pack; echo "stream A/B after $(( $(date +%s) - TS )) s"
ok 320 && timeout 150 python3 -m bench.serve_bench --gpu --phases hf,c64,c256,c1 --c1-requests 5 --hf-baselines static_compiled \
  --out /tmp/r2/serve > /tmp/r2/serve.txt 2>&1
kill_stack; rm -rf /tmp/r2/serve/logs; grep -E "c64:|c256:|c1:|static_compiled:" /tmp/r2/serve.txt | cut -c1-240
pack; echo "serve after $(( $(date +%s) - TS )) s"
W 1b 470 --shape starcoderbase-1b --context 1152 --batches 1,64,256 --prefill 1024,8192
W tiny 500 --shape tiny_starcoder_py --context 1152 --batches 1,64 --prefill 1024
pack; echo "worker after $(( $(date +%s) - TS )) s"
S() { n=$1; ok $2 || return; shift 2; timeout 45 python3 -m bench.serve_bench --gpu --phases c1 --c1-requests 5 --out /tmp/r2/$n "$@" > /tmp/r2/$n.txt 2>&1
  kill_stack; rm -rf /tmp/r2/$n/logs; echo "$n: $(grep -E "c1:" /tmp/r2/$n.txt | cut -c24-150)"; pack; }
S c1_off 500 --worker-flags="--resident-rows=0"; S c1_on 530
timeout 12 bash -c "tar czf - -C ~ .cache/flashinfer .triton 2>/dev/null | split -b 15M - $OUT/jit.part"; ls -la $OUT
echo "done after $(( $(date +%s) - TS )) s"
