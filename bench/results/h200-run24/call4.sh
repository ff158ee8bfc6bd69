#!/bin/bash
# Run 24 call 4 (carry [".whl", ".jit"]; prologue as run 23's call1.sh): the next projection's weight read into L2 by
# extra CTAs of our own kernels, beside work that leaves HBM idle: the decode attention's kernel reads attn.c_proj
# (--attn-l2-rows N: N extra rows of `splits` CTAs), each fused norm reads the projection after it (c_fc, the next
# layer's c_attn; --l2-norm-ctas N); the decode attention's first K/V tile read before its PDL wait (--attn-early-tile:
# only each request's newest row, which the K/V write ahead writes, after it). Worker bench 1B B = 1 / 16 / 64, GPU time of a step, alternated. Then the
# split-K GEMMs with a shared-memory budget (--splitk-smem-kb: 3 CTAs an SM at 72 KB instead of 1 at the default's
# 192 KB, so a programmatic dependent launch can overlap the kernel ahead; bench/kernel_static.py --gemms): the 1B
# (cuBLAS by default) and the tiny model (split-K by default). Then the GPU tests of both.
mkdir -p /tmp/r
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name --format=csv,noheader
A() { n=$1; shift; ok 300 || return; timeout 50 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --context 1152 \
  --decode-steps 8 --prefill "" --batches 1,16,64 --json-out /tmp/r/a_$n.json "$@" > /tmp/r/a_$n.txt 2>&1; echo "$n:"
  grep -E 'replay alone' /tmp/r/a_$n.txt | awk '{print $8, $9}' | tr '\n' ' '; echo; }
A default1; A attn8 --attn-l2-rows 8; A attn33 --attn-l2-rows 33; A norm132 --l2-norm-ctas 132
A both --attn-l2-rows 33 --l2-norm-ctas 132; A default2; A early_tile --attn-early-tile
A sk200 --splitk-rows 64; A sk72 --splitk-rows 64 --splitk-smem-kb 72; A sk100 --splitk-rows 64 --splitk-smem-kb 100
A default3
T() { n=$1; shift; ok 380 || return; timeout 50 python3 -m worker_svc.bench --shape tiny_starcoder_py --dtype bfloat16 \
  --context 1152 --decode-steps 8 --prefill "" --batches 1,16,64 --json-out /tmp/r/t_$n.json "$@" > /tmp/r/t_$n.txt 2>&1
  echo "tiny $n:"; grep -E 'replay alone' /tmp/r/t_$n.txt | awk '{print $8, $9}' | tr '\n' ' '; echo; }
T default1; T sk72 --splitk-smem-kb 72; T sk100 --splitk-smem-kb 100; T cublas --splitk-rows 0; T default2
pack; echo "in-graph after $(( $(date +%s) - TS )) s"
ok 420 && timeout 120 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py tests/worker/test_gpu_fused.py \
  tests/worker/test_gpu_skinny_gemm.py \
  -k "programmatic or prefetch or skinny or splitk" > /tmp/r/tests.txt 2>&1; tail -3 /tmp/r/tests.txt
pack; echo "done after $(( $(date +%s) - TS )) s"
