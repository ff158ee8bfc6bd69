#!/bin/bash
# H200 run 12, call 1 (prepared in session 9): the Triton decode attention (--decode-attention triton) first on the
# GPU inside the worker. 1. GPU tests (test_gpu.py: the kernel against float32, the decode graphs with it against
# eager flashinfer, one-step and multi-step; the other GPU files: the launch-ahead removal's first GPU run).
# 2. bench/attn_bench.py again (the merge is now one CTA per (request, head): run 11's 1B B = 1 was 4x slower).
# 3. worker bench, K = 8, context 1,152, B = 1, 64, 256, 1B and tiny, flashinfer / triton alternated twice.
# Carry [".whl"] (and ".jit" when there is one: without it the tests compile flashinfer for ~280 s and the cache
# goes back as $OUT/jit.part*). Prologue: bench/README.md (run 10/11). Results packed into $OUT/json.tgz.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
if [ -d .jit ]; then cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"; else NOJIT=1; fi
timeout 420 python3 -m pytest -o addopts="" -q -p no:warnings tests/worker/test_gpu.py tests/worker/test_gpu_fused.py \
  tests/worker/test_gpu_skinny_gemm.py tests/worker/test_gpu_whole_graph.py 2>&1 | tail -30 > /tmp/r/tests.txt
echo "tests after $(( $(date +%s) - T0 )) s"; cat /tmp/r/tests.txt; pack
[ -n "$NOJIT" ] && (cd ~ && tar czf /tmp/jit.tgz .cache/flashinfer .triton 2>/dev/null) && split -b 15000000 -d /tmp/jit.tgz $OUT/jit.part
left 470 && timeout 90 python3 -m bench.attn_bench --layouts contiguous --out /tmp/r/a > /tmp/r/attn.txt 2>&1; grep "B=" /tmp/r/attn.txt; pack
B() { n=$1; shift; timeout 80 python3 -m worker_svc.bench --dtype bfloat16 --context 1152 --decode-steps 8 --batches 1,64,256 \
        --prefill 16 --json-out /tmp/r/w_$n.json "$@" 2>&1 | grep -v Warn | tail -14 > /tmp/r/w_$n.txt; cat /tmp/r/w_$n.txt; pack; }
for i in 1 2; do for a in flashinfer triton; do for s in starcoderbase-1b tiny_starcoder_py; do
  left 500 && B ${s}_${a}$i --shape $s --decode-attention $a
done; done; done
echo "done after $(( $(date +%s) - T0 )) s"
