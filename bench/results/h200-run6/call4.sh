#!/bin/bash
# H200 run 6, call 4: issue 11 routing benchmark (two replicas sharing the GPU, three policies, two rates),
# issue 15 mixed chunks A/B end to end (c64, c256 with / without), the eager extend's profile (tiny shape)
set -x
mkdir -p /tmp/r
K() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher" ; sleep 2; }
W() { python3 -m worker_svc.bench --shape $1 --batches 1 --prefill 16 --iters 1 --cuda-graph-max-batch 1 > /dev/null 2>&1; }
W starcoderbase-1b & W tiny_starcoder_py &
python3 -m worker_svc.model.default --shape starcoderbase-1b --dtype bfloat16 --device cuda --out /tmp/codeserve-bench-model > /dev/null
wait
timeout 220 python3 -m bench.router_bench --gpu --out /tmp/router --replicas 2 --rates 64,128 --duration 12 > $OUT/router.txt 2>&1
K
cp /tmp/router/router_bench.json /tmp/r/ 2>/dev/null; cp /tmp/router/router_bench_table.txt $OUT/ 2>/dev/null
timeout 140 python3 -m bench.serve_bench --gpu --shape starcoderbase-1b --model-dir /tmp/codeserve-bench-model --phases c64,c256,nomixed --out /tmp/sb > $OUT/serve.txt 2>&1
K
cp /tmp/sb/serve_bench.json /tmp/r/serve_mixed.json; cp /tmp/sb/serve_bench_table.txt $OUT/serve_mixed_table.txt
timeout 40 python3 -m worker_svc.bench --shape tiny_starcoder_py --dtype bfloat16 --batches 1 --context 128 --prefill 96 --iters 4 --profile /tmp/r/prof > /dev/null 2>&1
rm -f /tmp/r/prof/trace-*.json
cp /tmp/router/router_bench.json /tmp/r/ 2>/dev/null; cp /tmp/sb/serve_bench.json /tmp/r/serve_mixed.json 2>/dev/null
tar czf $OUT/json.tgz -C /tmp/r .
