#!/bin/bash
# H200 run 8, call 2: serve_bench against transformers' compiled static generate in the same run, c1 and c64 with
# the chunked-prefill pipeline (session 5, default) and c64 without it (nopipe), c256. Same carry and prologue as
# call1.sh: bash bench/results/h200-run8/call2.sh > $OUT/log.txt 2>&1
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d ~/.cache/flashinfer ] || { cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"; }
[ -d /tmp/codeserve-bench-model ] || python3 -m worker_svc.model.default --shape starcoderbase-1b --dtype bfloat16 --device cuda --out /tmp/codeserve-bench-model > /dev/null
echo "ready after $(( $(date +%s) - T0 )) s"
timeout 500 python3 -m bench.serve_bench --gpu --shape starcoderbase-1b --model-dir /tmp/codeserve-bench-model --phases hf,c1,c64,nopipe,c256 --hf-baselines static_compiled --out /tmp/sb > $OUT/serve.txt 2>&1
pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"
cp /tmp/sb/serve_bench*.json /tmp/sb/serve_bench*table* /tmp/r/ 2>/dev/null
echo "serve after $(( $(date +%s) - T0 )) s"
tar czf $OUT/json.tgz -C /tmp/r .
