#!/bin/bash
# H200 run 7, call 1: the GPU tests after run 6's worker changes (K/V write fusion, index-capacity fix), the
# one-replica routing run, and the JIT caches sent back so later calls can carry them (a cold JIT is ~150 s/head dim)
set -x
mkdir -p /tmp/r
W() { python3 -m worker_svc.bench --shape $1 --batches 1 --prefill 16 --iters 1 --cuda-graph-max-batch 1 > /dev/null 2>&1; }
W starcoderbase-1b & W tiny_starcoder_py &
python3 -m worker_svc.model.default --shape starcoderbase-1b --dtype bfloat16 --device cuda --out /tmp/codeserve-bench-model > /dev/null
wait
timeout 300 python3 -m pytest -o addopts="" -q -x tests/worker/test_gpu.py tests/worker/test_gpu_fused.py 2>&1 | grep -v "Warning\|warnings.warn" | tail -30 > $OUT/tests.txt
du -sh ~/.cache/flashinfer ~/.triton 2>&1 | tee $OUT/jit_sizes.txt
(cd ~ && tar czf /tmp/jit.tgz .cache/flashinfer .triton 2>/dev/null); ls -la /tmp/jit.tgz >> $OUT/jit_sizes.txt
[ $(stat -c %s /tmp/jit.tgz) -lt 16000000 ] && cp /tmp/jit.tgz $OUT/jit.tgz
timeout 200 python3 -m bench.router_bench --gpu --out /tmp/router1 --replicas 1 --rates 32,64,128 --duration 12 > $OUT/router1.txt 2>&1
pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"
cp /tmp/router1/router_bench.json /tmp/r/router1.json; cp /tmp/router1/router_bench_table.txt /tmp/r/router1_table.txt
mkdir -p /tmp/r/logs1; for f in $(find /tmp/router1/logs -type f); do tail -c 20000 $f > /tmp/r/logs1/$(echo $f | tr / _); done
tar czf $OUT/json.tgz -C /tmp/r .
