#!/bin/bash
# Session 31 call 2 (the machine of call 1, warm; same carry and prologue): every target of issue 15 with the
# resident-weight GEMV on for batches of up to 4 rows (RR, default 4; flags, so no commit between the calls):
# serve_bench hf,c64,c256,c1 (transformers' compiled static generate in the same run), worker bench 1B and tiny.
RR=${RR:-4}
mkdir -p /tmp/r2; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r2 .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 170 python3 -m bench.serve_bench --gpu --phases hf,c64,c256,c1 --c1-requests 5 --hf-baselines static_compiled \
  --worker-flags="--resident-rows=$RR" --out /tmp/r2/serve > /tmp/r2/serve.txt 2>&1
kill_stack; rm -rf /tmp/r2/serve/logs; grep -E "c64:|c256:|c1:|static_compiled:" /tmp/r2/serve.txt | cut -c1-240
pack; echo "serve after $(( $(date +%s) - TS )) s"
W() { n=$1; shift; ok $1 || return; shift; timeout 80 python3 -m worker_svc.bench --dtype bfloat16 --decode-steps 8 \
  --json-out /tmp/r2/w_$n.json "$@" > /tmp/r2/w_$n.txt 2>&1; echo "$n:"; grep -E "replay alone|prefill" /tmp/r2/w_$n.txt | cut -c1-200; }
W 1b 300 --shape starcoderbase-1b --context 1152 --batches 1,64,256 --prefill 1024,8192 --resident-rows $RR
W tiny 380 --shape tiny_starcoder_py --context 1152 --batches 1,64 --prefill 1024 --resident-rows $RR
pack; echo "worker after $(( $(date +%s) - TS )) s"
S() { n=$1; ok $2 || return; shift 2; timeout 45 python3 -m bench.serve_bench --gpu --phases c1 --c1-requests 5 --out /tmp/r2/$n "$@" > /tmp/r2/$n.txt 2>&1
  kill_stack; rm -rf /tmp/r2/$n/logs; echo "$n: $(grep -E "c1:" /tmp/r2/$n.txt | cut -c24-150)"; pack; }
S c1_r0_b 470; S c1_r4_b 520 --worker-flags="--resident-rows=$RR"
echo "done after $(( $(date +%s) - TS )) s"
