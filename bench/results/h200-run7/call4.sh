#!/bin/bash
# H200 run 7, call 4: where an editor request's TTFT goes. The editor workload (tiny shape, PSM) with 1 typist (the
# fixed path, no queue) and with 20 (py-spy samples of the scheduler and gateway meanwhile); serve_bench's c1 phase
# (1B shape, a 1,024-token prompt: TTFT with the piecewise extend graphs).
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} + # ninja: the restored JIT builds are newer
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
W() { python3 -m worker_svc.bench --shape $1 --batches 1 --prefill 16 --iters 1 --cuda-graph-max-batch 1 --extend-graph-max-tokens 0 > /dev/null 2>&1; }
W starcoderbase-1b & W tiny_starcoder_py &
python3 -m worker_svc.model.default --shape starcoderbase-1b --dtype bfloat16 --device cuda --out /tmp/codeserve-bench-model > /dev/null &
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
wait; echo "warm after $(( $(date +%s) - T0 )) s"
E() { timeout 120 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm --duration 15 --typists $1 --out /tmp/ed$1 > $OUT/editor$1.txt 2>&1; }
E 1
( for i in $(seq 1 60); do sleep 1; S=$(pgrep -f "m scheduler_svc" | head -1); G=$(pgrep -f "m gateway" | head -1); [ -n "$S" ] && [ -n "$G" ] && break; done
  sleep 25; /tmp/site/bin/py-spy record -p $G -d 10 -r 200 --idle -f raw -o /tmp/r/spy_gateway.txt --nonblocking > /tmp/r/spy_g.log 2>&1 &
  /tmp/site/bin/py-spy record -p $S -d 10 -r 200 --idle -f raw -o /tmp/r/spy_scheduler.txt --nonblocking > /tmp/r/spy_s.log 2>&1 ) &
E 20
wait
pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"
for t in 1 20; do mkdir -p /tmp/r/ed$t; cp /tmp/ed$t/editor_*.json /tmp/r/ed$t/; tail -c 30000 /tmp/ed$t/logs/scheduler.log > /tmp/r/ed$t/scheduler.log; done
echo "editor after $(( $(date +%s) - T0 )) s"
timeout 150 python3 -m bench.serve_bench --gpu --shape starcoderbase-1b --model-dir /tmp/codeserve-bench-model --phases c1 --out /tmp/sb > $OUT/serve.txt 2>&1
cp /tmp/sb/serve_bench*.json /tmp/sb/serve_bench*table* /tmp/r/ 2>/dev/null
echo "serve after $(( $(date +%s) - T0 )) s"
tar czf $OUT/json.tgz -C /tmp/r .
