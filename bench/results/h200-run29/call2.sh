#!/bin/bash
# Session 29 call 2: c64/c256 again keeping each phase's Forward log (why 256-row decodes are not launched behind), and a
# B = 64 / 256 worker profile (op table per step).
mkdir -p /tmp/r2; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} + 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m bench.serve_bench --gpu --phases c64,c256 --out /tmp/r2/serve > /tmp/r2/serve.txt 2>&1
pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
grep -E "c64:|c256:" /tmp/r2/serve.txt | cut -c1-300
find /tmp/r2/serve -name "forwards*.tsv" | while read f; do echo "== $f"; python3 -m bench.forward_timeline "$f" 2>&1 | tail -40; done
timeout 150 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --decode-steps 8 --context 1152 --prefill "" \
  --batches 64,256 --profile /tmp/r2/prof > /tmp/r2/w_prof.txt 2>&1; grep -E "replay alone|ms a step|chained" /tmp/r2/w_prof.txt | cut -c1-200
rm -rf /tmp/r2/serve/logs
tar czf $OUT/r2.tgz -C /tmp/r2 .
