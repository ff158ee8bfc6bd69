#!/bin/bash
# H200 run 12, call 4: (1) GPU tests of the Triton decode attention (PDL launches; the graph test's cross-kernel
# bound); (2) worker bench with the defaults the worker runs (auto split-K, PDL, auto decode attention), the chained
# Forwards at switch intervals 5 (CPython's) / 0.2 / 0.05 ms (common/gil.py); tiny and 1B, flashinfer against
# triton decode attention. Carry [".whl", ".jit"]. Results in $OUT/json.tgz.
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
timeout 200 python3 -m pytest -o addopts="" -q -p no:warnings tests/worker/test_gpu.py -k "triton or mqa" 2>&1 | tail -15 > /tmp/r/tests.txt
cat /tmp/r/tests.txt; pack
W() { n=$1; shift; timeout 100 python3 -m worker_svc.bench --dtype bfloat16 --context 1152 --decode-steps 8 --prefill 16 \
        --gil-switch-ms 5,0.2,0.05 --json-out /tmp/r/w_$n.json "$@" 2>&1 | grep -v -i warn | tail -22 > /tmp/r/w_$n.txt; cat /tmp/r/w_$n.txt; pack; }
for i in 1 2; do
  W tiny_auto$i --shape tiny_starcoder_py --batches 1,64,256
  W tiny_fi$i --shape tiny_starcoder_py --batches 1,64,256 --decode-attention flashinfer
done
W 1b_auto --shape starcoderbase-1b --batches 1,64,256
W 1b_triton --shape starcoderbase-1b --batches 1,64,256 --decode-attention triton
echo "done after $(( $(date +%s) - T0 )) s"
