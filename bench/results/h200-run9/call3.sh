#!/bin/bash
# H200 run 9, call 3: programmatic dependent launch (PDL) and the split-K GEMM in the decode graph. GPU tests of
# both first; gemm_bench at M = 1 (call 2 stopped there: M = 1 is a Triton constexpr); then worker_svc.bench
# (context 1,152, K = 8, B = 1 and 64; graph replay = GPU time of a step) on tiny and 1B shapes, four variants:
# default, --pdl (our Triton kernels as dependent launches), --splitk-rows 256 (projections through
# skinny_gemm), both; alternated twice. Same carry and prologue as call1.sh.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
python3 -c "import triton; print('triton', triton.__version__)"
timeout 120 python3 -m pytest -o addopts="" -q tests/worker/test_gpu_skinny_gemm.py tests/worker/test_gpu_fused.py 2>&1 | grep -v "Warning\|warnings.warn" | tail -15 > /tmp/r/tests.txt
echo "tests after $(( $(date +%s) - T0 )) s"; cat /tmp/r/tests.txt
tar czf $OUT/json.tgz -C /tmp/r .
B() { n=$1; shift; timeout 100 python3 -m worker_svc.bench --dtype bfloat16 --context 1152 --decode-steps 8 --batches 1,64 --prefill 1024 --json-out /tmp/r/w_$n.json "$@" 2>&1 | grep -v Warn | tail -8 > /tmp/r/w_$n.txt; }
for i in 1 2; do for s in tiny_starcoder_py starcoderbase-1b; do
  B ${s}_default$i --shape $s
  B ${s}_pdl$i --shape $s --pdl
  B ${s}_splitk$i --shape $s --splitk-rows 256
  B ${s}_splitk_pdl$i --shape $s --splitk-rows 256 --pdl
done; tar czf $OUT/json.tgz -C /tmp/r .; echo "worker bench $i after $(( $(date +%s) - T0 )) s"; done
timeout 100 python3 -m bench.gemm_bench --shape starcoderbase-1b --rows 1 --out /tmp/r/gemm_1b_m1 2>&1 | tail -6 > /tmp/r/gemm_1b_m1.txt
timeout 60 python3 -m bench.gemm_bench --shape tiny_starcoder_py --rows 1,64 --out /tmp/r/gemm_tiny 2>&1 | tail -12 > /tmp/r/gemm_tiny.txt
echo "gemm after $(( $(date +%s) - T0 )) s"
tar czf $OUT/json.tgz -C /tmp/r .
