#!/bin/bash
# H200 run 14, call 1 (prepared in session 11): (1) test_gpu.py, not run in session 11, with its new
# test_chained_forwards_on_cuda_graphs_use_the_metadata_built_ahead (prepare-ahead on the CUDA graphs, flashinfer and
# Triton buckets); (2) where the editor's ~3 ms extend Forward goes (run 13 call 2: 3.04 ms p50 against ~0.6 ms of
# whole-graph replay): the worker bench's extend of 128 tokens after a cached 1,700-token prefix, tiny, profiled.
# Carry [".whl", ".jit"] (without .jit the tests compile flashinfer for ~300 s and the cache goes back as $OUT/jit.part*; run 13
# call 1's pytest, killed by its timeout, left processes that slowed what came after: hence the pkill).
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
if [ -d .jit ]; then cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"; else NOJIT=1; fi
timeout 300 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py 2>&1 | tail -15 > /tmp/r/tests.txt
[ -n "$NOJIT" ] && (cd ~ && tar czf /tmp/jit.tgz .cache/flashinfer .triton 2>/dev/null) && split -b 15000000 -d /tmp/jit.tgz $OUT/jit.part
pkill -9 -f pytest; echo "tests after $(( $(date +%s) - T0 )) s"; cat /tmp/r/tests.txt; pack
left 450 && timeout 120 python3 -m worker_svc.bench --shape tiny_starcoder_py --dtype bfloat16 --batches 1 --decode-steps 1 \
  --prefill 128 --prefill-prefix 1700 --profile /tmp/r/prof_ext --json-out /tmp/r/w_ext.json 2>&1 | grep -v -i warn | tail -8 | tee /tmp/r/w_ext.txt
gzip -f /tmp/r/prof_ext/*.json 2>/dev/null; pack
echo "done after $(( $(date +%s) - T0 )) s"
