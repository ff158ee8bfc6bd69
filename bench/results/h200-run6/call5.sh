#!/bin/bash
# H200 run 6, call 5: issue 11 routing benchmark again (call 4's stopped when a scheduler went away; its logs are
# kept this time), two replicas sharing the GPU, round_robin vs cache_aware at 64 requests/s
set -x
mkdir -p /tmp/r
python3 -m worker_svc.bench --shape starcoderbase-1b --batches 1 --prefill 16 --iters 1 --cuda-graph-max-batch 1 > /dev/null 2>&1 &
python3 -m worker_svc.model.default --shape starcoderbase-1b --dtype bfloat16 --device cuda --out /tmp/codeserve-bench-model > /dev/null
wait
timeout 200 python3 -m bench.router_bench --gpu --out /tmp/router --replicas 2 --rates 64 --duration 10 --policies round_robin,cache_aware > $OUT/router.txt 2>&1
pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"
cp /tmp/router/router_bench.json /tmp/router/router_bench_table.txt /tmp/r/ 2>/dev/null
mkdir -p /tmp/r/logs; for f in $(find /tmp/router/logs -type f); do tail -c 20000 $f > /tmp/r/logs/$(echo $f | tr / _); done
tar czf $OUT/json.tgz -C /tmp/r .
