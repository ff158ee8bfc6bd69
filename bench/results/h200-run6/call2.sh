#!/bin/bash
# H200 run 6, call 2 (issue 15 A/B: fused K/V write + strided q; skinny GEMM survey; issue 13 editor bench)
set -x
mkdir -p /tmp/r
W() { python3 -m worker_svc.bench --shape $1 --batches 1 --prefill 16 --iters 1 --cuda-graph-max-batch 1 > /dev/null 2>&1; }
W starcoderbase-1b & W tiny_starcoder_py &
python3 -m bench.skinny_gemm --shapes starcoderbase-1b,tiny_starcoder_py --ms 1,16,64,128 --json-out /tmp/r/skinny.json > $OUT/skinny.txt 2>&1
wait
python3 -m pytest -o addopts="" -q tests/worker/test_gpu_fused.py "tests/worker/test_gpu_shapes.py::test_7b_fp32_on_gpu_equals_transformers" 2>&1 | grep -v Warning | tail -25 > $OUT/tests.txt
for s in starcoderbase-1b tiny_starcoder_py; do for f in gelu all; do
  python3 -m worker_svc.bench --shape $s --dtype bfloat16 --batches 1,64,256 --context 1152 --decode-steps 8 --fused $f --json-out /tmp/r/w_${s}_$f.json 2>&1 | grep -v Warn | tail -6 >> $OUT/worker.txt
done; done
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
timeout 150 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm,spm --duration 20 --out /tmp/ed > $OUT/editor.txt 2>&1
cp /tmp/ed/editor_*.json /tmp/r/ 2>/dev/null
tar czf $OUT/json.tgz -C /tmp/r .
