#!/bin/bash
# H200 run 10, call 1 (prepared in session 7, run in session 8): the GPU tests first (StepFeed now plans all K
# steps of a Forward at its start: test_gpu.py's multi-step-on-graphs tests are its check; the split-K + PDL
# tests), then the worker's K = 8 step before / after that change (before = the three files in ./before,
# session 7's HEAD before it), tiny and 1B at B = 1, 64, 256: the host part of a step is step_ms - graph_replay_ms.
# This checkout had no JIT cache: the tests compile flashinfer's kernels (a bench warms the two bench shapes
# beside them), and the cache goes back as $OUT/jit.part* for the next calls' carry.
# Carry [".whl"] (and ".jit" when there is one); run:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null;
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MAX_JOBS=16; bash bench/results/h200-run10/call1.sh > $OUT/log.txt 2>&1
# Results: everything under /tmp/r, packed into $OUT/json.tgz (a call returns at most 8 files).
set -x
mkdir -p /tmp/r /tmp/after
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
for s in tiny_starcoder_py starcoderbase-1b; do  # the bench shapes' kernels, compiled beside the tests
  timeout 400 python3 -m worker_svc.bench --shape $s --dtype bfloat16 --batches 1,64 --prefill 16 --iters 1 --decode-steps 8 > /tmp/r/warm_$s.txt 2>&1 &
done
timeout 420 python3 -m pytest -o addopts="" -q tests/worker/test_gpu.py tests/worker/test_gpu_fused.py tests/worker/test_gpu_skinny_gemm.py 2>&1 | grep -v "Warning\|warnings.warn" | tail -15 > /tmp/r/tests.txt
TRITON_INTERPRET=1 timeout 120 python3 -m pytest -o addopts="" -q tests/worker/test_skinny_gemm_interpreter.py 2>&1 | tail -3 > /tmp/r/tests_interpreter.txt  # skipped in CI (no Triton there)
wait
echo "tests after $(( $(date +%s) - T0 )) s"; cat /tmp/r/tests.txt /tmp/r/tests_interpreter.txt; tar czf $OUT/json.tgz -C /tmp/r .
(cd ~ && tar czf /tmp/jit.tgz .cache/flashinfer .triton 2>/dev/null) && split -b 15000000 -d /tmp/jit.tgz $OUT/jit.part; ls -la $OUT
D=bench/results/h200-run10/before
cp worker_svc/step_feed.py worker_svc/cuda_graph.py worker_svc/multistep.py /tmp/after/
use() { if [ $1 = before ]; then cp $D/*.py worker_svc/; else cp /tmp/after/*.py worker_svc/; fi; }
B() { n=$1; shift; timeout 100 python3 -m worker_svc.bench --dtype bfloat16 --context 1152 --decode-steps 8 --batches 1,64,256 --prefill 1024 --json-out /tmp/r/w_$n.json "$@" 2>&1 | grep -v Warn | tail -10 > /tmp/r/w_$n.txt; }
for i in 1 2; do for v in before after; do use $v; for s in tiny_starcoder_py starcoderbase-1b; do
  [ $(( $(date +%s) - T0 )) -lt 520 ] && B ${s}_${v}$i --shape $s
done; done; tar czf $OUT/json.tgz -C /tmp/r .; echo "worker bench $i after $(( $(date +%s) - T0 )) s"; done
use after
