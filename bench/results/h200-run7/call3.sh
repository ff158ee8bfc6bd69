#!/bin/bash
# H200 run 7, call 3: piecewise extend graphs (worker_svc/extend_graph.py). GPU tests; worker bench with each
# extend eager and through the pieces back to back (tiny and 1B, with and without a cached 1,700-token prefix);
# the editor workload with the pieces and without (--extend-graph-max-tokens 0), one machine, back to back.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
W() { python3 -m worker_svc.bench --shape $1 --batches 1 --prefill 16 --iters 1 --cuda-graph-max-batch 1 --extend-graph-max-tokens 0 > /dev/null 2>&1; }
W starcoderbase-1b & W tiny_starcoder_py &
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
wait; echo "warm after $(( $(date +%s) - T0 )) s"
timeout 200 python3 -m pytest -o addopts="" -q -x tests/worker/test_gpu.py tests/worker/test_gpu_fused.py 2>&1 | grep -v "Warning\|warnings.warn\|^tests/worker.*hf$" | tail -25 > $OUT/tests.txt
echo "tests after $(( $(date +%s) - T0 )) s"
B() { python3 -m worker_svc.bench --dtype bfloat16 --context 1152 "$@" 2>&1 | grep -v Warn | tail -12 >> $OUT/worker.txt; }
B --shape tiny_starcoder_py --batches 1,64 --decode-steps 8 --prefill 32,96,256,1024 --json-out /tmp/r/w_tiny.json
B --shape tiny_starcoder_py --batches 1 --prefill 32,96,384 --prefill-prefix 1700 --json-out /tmp/r/w_tiny_prefix.json --profile /tmp/r/prof
B --shape starcoderbase-1b --batches 64 --decode-steps 8 --prefill 96,1024 --json-out /tmp/r/w_1b.json
echo "worker bench after $(( $(date +%s) - T0 )) s"
for x in 1024 0; do
  timeout 150 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm,spm --duration 20 --extend-graph-max-tokens $x --out /tmp/ed$x > $OUT/editor$x.txt 2>&1
  mkdir -p /tmp/r/ed$x; cp /tmp/ed$x/editor_*.json /tmp/r/ed$x/; for f in /tmp/ed$x/logs/*; do tail -c 30000 $f > /tmp/r/ed$x/$(basename $f); done
  pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"
done
echo "editor after $(( $(date +%s) - T0 )) s"
rm -f /tmp/r/prof/trace-*.json
tar czf $OUT/json.tgz -C /tmp/r .
