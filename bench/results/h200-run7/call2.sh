#!/bin/bash
# H200 run 7, call 2: issue 11 routing benchmark, two replicas sharing the GPU, the three policies
set -x
mkdir -p /tmp/r
python3 -m worker_svc.bench --shape starcoderbase-1b --batches 1 --prefill 16 --iters 1 --cuda-graph-max-batch 1 > /dev/null 2>&1 &
python3 -m worker_svc.model.default --shape starcoderbase-1b --dtype bfloat16 --device cuda --out /tmp/codeserve-bench-model > /dev/null
wait
(cd ~ && tar czf /tmp/jit.tgz .cache/flashinfer .triton 2>/dev/null) && split -b 15000000 -d /tmp/jit.tgz $OUT/jit.part &
timeout 500 python3 -m bench.router_bench --gpu --out /tmp/router --replicas 2 --rates 32,48,64 --duration 12 --policies round_robin,cache_aware,least_load > $OUT/router.txt 2>&1
pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"
cp /tmp/router/router_bench.json /tmp/r/router2.json; cp /tmp/router/router_bench_table.txt /tmp/r/router2_table.txt
mkdir -p /tmp/r/logs2; for f in $(find /tmp/router/logs -type f); do tail -c 20000 $f > /tmp/r/logs2/$(echo $f | tr / _); done
wait
tar czf $OUT/json.tgz -C /tmp/r .
