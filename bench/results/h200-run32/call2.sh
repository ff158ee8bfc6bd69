#!/bin/bash
# Session 32 call 2: the resident-weight tensor-core GEMM (model/resident_gemm.py, new: c_attn and attn.c_proj at 5-64
# rows, each CTA's weight slab loaded before its PDL wait). In order, each step guarded by the time left: its kernel
# GPU tests (no flashinfer), the worker bench A/B on the 1B (--resident-mm-rows 0 against 64 with CTAs of 8 warps x
# 64 columns and 4 x 64; GPU time of a decode step at B = 16 / 32 / 64; alternated twice; the first run builds the
# JIT cache), the same on tiny (4 x 32), the served-model test, a profile of the 1B's B = 64 step with it.
# Carry [".whl"] (the JIT cache is built here and packed to $OUT/jit.part* at the end); prologue as call1.sh.
mkdir -p /tmp/r3; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r3 .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 100 python3 -m pytest -o addopts="" -q -p no:warnings -rf -x tests/worker/test_gpu_resident_gemm.py -k "not served" > /tmp/r3/tests.txt 2>&1
tail -3 /tmp/r3/tests.txt; pack; echo "tests after $(( $(date +%s) - TS )) s"
W() { n=$1; shift; ok $1 || return; shift; timeout 200 python3 -m worker_svc.bench --dtype bfloat16 --decode-steps 8 \
  --context 1152 --prefill "" --json-out /tmp/r3/w_$n.json "$@" > /tmp/r3/w_$n.txt 2>&1; echo "$n: $(grep -E "replay alone" /tmp/r3/w_$n.txt | awk '{print $(NF-8)}' | tr '\n' ' ') after $(( $(date +%s) - TS )) s"; }
for i in 1 2; do
  W 1b_mm0_$i 400 --shape starcoderbase-1b --batches 16,32,64 --resident-mm-rows 0
  W 1b_mm4x64_$i 420 --shape starcoderbase-1b --batches 16,32,64 --resident-mm-rows 64 --resident-mm-shape 4x64
  W 1b_mm8x64_$i 440 --shape starcoderbase-1b --batches 16,32,64 --resident-mm-rows 64
done
pack; echo "1B A/B after $(( $(date +%s) - TS )) s"
for i in 1 2; do
  W tiny_mm0_$i 470 --shape tiny_starcoder_py --batches 16,32,64 --resident-mm-rows 0
  W tiny_mm4x32_$i 480 --shape tiny_starcoder_py --batches 16,32,64 --resident-mm-rows 64 --resident-mm-shape 4x32
done
pack; echo "A/B after $(( $(date +%s) - TS )) s"
ok 500 && timeout 60 python3 -m pytest -o addopts="" -q -p no:warnings -rf -s tests/worker/test_gpu_resident_gemm.py -k served > /tmp/r3/tests_served.txt 2>&1
tail -3 /tmp/r3/tests_served.txt; pack
ok 540 && { timeout 40 python3 -m worker_svc.bench --dtype bfloat16 --decode-steps 8 --context 1152 --prefill "" \
  --shape starcoderbase-1b --batches 64 --resident-mm-rows 64 --resident-mm-shape 4x64 --profile /tmp/r3/prof_mm > /tmp/r3/prof_mm.txt 2>&1
  for f in /tmp/r3/prof_mm/trace-b64.json*; do python3 -m bench.kernel_breakdown $f --hbm-tbs 4.8 > /tmp/r3/breakdown_mm_b64.txt 2>&1; done
  head -20 /tmp/r3/breakdown_mm_b64.txt; gzip -f /tmp/r3/prof_mm/*.json 2>/dev/null; pack; }
timeout 12 bash -c "tar czf - -C ~ .cache/flashinfer .triton 2>/dev/null | split -b 15M - $OUT/jit.part"; ls -la $OUT
echo "done after $(( $(date +%s) - TS )) s"
