#!/bin/bash
# H200 run 10, call 1 (prepared in session 7): the GPU tests first (StepFeed now plans all K steps of a Forward
# at its start: test_gpu.py's multi-step-on-graphs tests are its check; the split-K + PDL tests), then the
# worker's K = 8 step before / after that change (before = the three files in ./before, session 7's HEAD before
# it), alternated twice, tiny and 1B at B = 1, 64, 256: the host part of a step is step_ms - graph_replay_ms.
# Carry [".whl", ".jit"]; run:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null;
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MAX_JOBS=16; bash bench/results/h200-run10/call1.sh > $OUT/log.txt 2>&1
# Results: everything under /tmp/r, packed into $OUT/json.tgz (a call returns at most 8 files).
set -x
mkdir -p /tmp/r /tmp/after
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
timeout 180 python3 -m pytest -o addopts="" -q tests/worker/test_gpu.py tests/worker/test_gpu_fused.py tests/worker/test_gpu_skinny_gemm.py 2>&1 | grep -v "Warning\|warnings.warn" | tail -15 > /tmp/r/tests.txt
TRITON_INTERPRET=1 timeout 120 python3 -m pytest -o addopts="" -q tests/worker/test_skinny_gemm_interpreter.py 2>&1 | tail -3 > /tmp/r/tests_interpreter.txt  # skipped in CI (no Triton there)
echo "tests after $(( $(date +%s) - T0 )) s"; cat /tmp/r/tests.txt /tmp/r/tests_interpreter.txt; tar czf $OUT/json.tgz -C /tmp/r .
D=bench/results/h200-run10/before
cp worker_svc/step_feed.py worker_svc/cuda_graph.py worker_svc/multistep.py /tmp/after/
use() { if [ $1 = before ]; then cp $D/*.py worker_svc/; else cp /tmp/after/*.py worker_svc/; fi; }
B() { n=$1; shift; timeout 100 python3 -m worker_svc.bench --dtype bfloat16 --context 1152 --decode-steps 8 --batches 1,64,256 --prefill 1024 --json-out /tmp/r/w_$n.json "$@" 2>&1 | grep -v Warn | tail -10 > /tmp/r/w_$n.txt; }
for i in 1 2; do for v in before after; do use $v; for s in tiny_starcoder_py starcoderbase-1b; do
  B ${s}_${v}$i --shape $s
done; done; tar czf $OUT/json.tgz -C /tmp/r .; echo "worker bench $i after $(( $(date +%s) - T0 )) s"; done
use after
