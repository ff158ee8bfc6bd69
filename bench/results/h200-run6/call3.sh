#!/bin/bash
# H200 run 6, call 3: issue 13 editor benchmark (tiny shape, 20 typists, ~1,500-token FIM prompts), issue 15
# end to end with the K/V write fusion (1B shape), the skinny GEMM survey with L2-cold weights
set -x
mkdir -p /tmp/r
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
W() { python3 -m worker_svc.bench --shape $1 --batches 1 --prefill 16 --iters 1 --cuda-graph-max-batch 1 > /dev/null 2>&1; }
W starcoderbase-1b &
timeout 200 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm,spm --duration 20 --out /tmp/ed > $OUT/editor.txt 2>&1
cp /tmp/ed/editor_*.json /tmp/r/
wait
timeout 330 python3 -m bench.serve_bench --gpu --shape starcoderbase-1b --model-dir /tmp/m1b --phases hf,c1,c64,c256 --hf-baselines static_compiled --out /tmp/sb > $OUT/serve.txt 2>&1
cp /tmp/sb/serve_bench.json /tmp/r/; cp /tmp/sb/serve_bench_table.txt $OUT/ 2>/dev/null
timeout 90 python3 -m bench.skinny_gemm --shapes starcoderbase-1b --ms 1,64 --json-out /tmp/r/skinny-l2-cold.json > $OUT/skinny.txt 2>&1
tar czf $OUT/json.tgz -C /tmp/r .
