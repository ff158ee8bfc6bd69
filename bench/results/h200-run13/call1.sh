#!/bin/bash
# H200 run 13, call 1 (prepared in session 10): what session 10 could not run. (1) GPU tests not run since the
# ragged-prefill merge: test_gpu_whole_graph.py, test_gpu_fused.py, test_gpu_shapes.py (their first fresh extends take
# the ragged path now); (2) the Triton decode attention on the 15B shape (auto gives the 3B-15B shapes none: measure
# before extending build.triton_decode_max_batch); (3) serve_bench 1B with transformers' compiled static generate in the
# same call (run 12 call 5 had no baseline), c64 with --rounds 3. Carry [".whl"] (and ".jit" when there is one: without
# it the tests compile flashinfer for ~280 s; bench/results/h200-run10/call1.sh returns it).
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
if [ -d .jit ]; then cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"; fi
timeout 300 python3 -m pytest -o addopts="" -q -p no:warnings tests/worker/test_gpu_whole_graph.py tests/worker/test_gpu_fused.py \
  tests/worker/test_gpu_shapes.py 2>&1 | tail -30 > /tmp/r/tests.txt
echo "tests after $(( $(date +%s) - T0 )) s"; cat /tmp/r/tests.txt; pack
W() { n=$1; shift; timeout 150 python3 -m worker_svc.bench --dtype bfloat16 --context 1152 --decode-steps 8 --prefill 16 \
        --json-out /tmp/r/w_$n.json "$@" 2>&1 | grep -v -i warn | tail -14 > /tmp/r/w_$n.txt; grep -E "replay alone|K=8" /tmp/r/w_$n.txt; pack; }
left 330 && W 15b_fi --shape starcoder --batches 1,64 --decode-attention flashinfer
left 400 && W 15b_triton --shape starcoder --batches 1,64 --decode-attention triton
left 470 && timeout 120 python3 -m bench.serve_bench --gpu --out /tmp/sb --phases hf,c64,c1 --hf-baselines static_compiled \
  > /tmp/r/serve.txt 2>&1; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; cp /tmp/sb/serve_bench.json /tmp/r/serve.json; pack
grep -A5 "^phase" /tmp/r/serve.txt; echo "done after $(( $(date +%s) - T0 )) s"
