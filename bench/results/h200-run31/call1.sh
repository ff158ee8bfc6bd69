#!/bin/bash
# Session 31 call 1, carry [".whl", ".jit2"] (prologue: pip install of .whl into /tmp/site, PYTHONPATH=/tmp/site:$PWD,
# the .jit2 cache untar'd into ~). In priority order, each step guarded by the time left of the call's 600 s:
# (1) the resident-weight GEMV's GPU tests; (2) its A/B in the worker bench (GPU time of a decode step at B = 1, 2, 4;
# 1B and tiny; --resident-rows 0 against 4, alternated); (3) a profile of the 1B's B = 1 step with it; (4) the GPU
# c1 served with and without it; (5) the GPU tests of the rest (test_gpu.py whole, extend_behind, fused, plan_ring).
mkdir -p /tmp/r; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 150 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu_resident_gemv.py tests/worker/test_gpu_skinny_gemm.py > /tmp/r/tests_resident.txt 2>&1
tail -3 /tmp/r/tests_resident.txt; pack; echo "resident tests after $(( $(date +%s) - TS )) s"
W() { n=$1; shift; ok $1 || return; shift; timeout 60 python3 -m worker_svc.bench --dtype bfloat16 --decode-steps 8 \
  --context 1152 --prefill "" --json-out /tmp/r/w_$n.json "$@" > /tmp/r/w_$n.txt 2>&1; echo "$n: $(grep -E "replay alone" /tmp/r/w_$n.txt | awk '{print $(NF-8)}' | tr '\n' ' ')"; }
S() { n=$1; ok $2 || return; shift 2; timeout 45 python3 -m bench.serve_bench --gpu --phases c1 --c1-requests 5 --out /tmp/r/$n "$@" > /tmp/r/$n.txt 2>&1
  kill_stack; rm -rf /tmp/r/$n/logs; echo "$n: $(grep -E "c1:" /tmp/r/$n.txt | cut -c24-150)"; pack; }
for i in 1 2; do
  W 1b_r0_$i 330 --shape starcoderbase-1b --batches 1,2,4 --resident-rows 0
  W 1b_r4_$i 330 --shape starcoderbase-1b --batches 1,2,4 --resident-rows 4
  W tiny_r0_$i 330 --shape tiny_starcoder_py --batches 1,2,4 --resident-rows 0
  W tiny_r4_$i 330 --shape tiny_starcoder_py --batches 1,2,4 --resident-rows 4
done
pack; echo "A/B after $(( $(date +%s) - TS )) s"
ok 340 && { timeout 60 python3 -m worker_svc.bench --dtype bfloat16 --decode-steps 8 --context 1152 --prefill "" \
  --shape starcoderbase-1b --batches 1 --resident-rows 4 --profile /tmp/r/prof_r4 > /tmp/r/prof_r4.txt 2>&1
  for f in /tmp/r/prof_r4/trace-b1.json*; do python3 -m bench.kernel_breakdown $f --hbm-tbs 3.35 > /tmp/r/breakdown_r4_b1.txt 2>&1; done
  head -14 /tmp/r/breakdown_r4_b1.txt; gzip -f /tmp/r/prof_r4/*.json 2>/dev/null; pack; }
S c1_r4 400 --worker-flags="--resident-rows=4"; S c1_r0 445
ok 450 && { timeout 140 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py tests/worker/test_gpu_extend_behind.py \
  tests/worker/test_gpu_fused.py tests/worker/test_plan_ring.py > /tmp/r/tests.txt 2>&1; tail -3 /tmp/r/tests.txt; pack; echo "tests after $(( $(date +%s) - TS )) s"; }
echo "done after $(( $(date +%s) - TS )) s"
