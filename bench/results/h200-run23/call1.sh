#!/bin/bash
# Run 23 call 1 (session 23; carry [".whl", ".jit"]). Prologue:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null;
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MAX_JOBS=16; bash bench/results/h200-run23/call1.sh > $OUT/log.txt 2>&1
# (1) serve_bench c64 (--rounds 2), alternated twice: the default (the arrival gate on, the gateway on uvloop +
#     httptools), --scheduler-flags=--no-arrival-gate, --gateway-flags="--loop asyncio --http h11";
# (2) worker bench 1B B = 64 with --profile: the decode step's kernels by kind (bench.kernel_breakdown), the
#     reference for the kernel work after the A/B.
mkdir -p /tmp/r
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
S() { n=$1; shift; ok 470 || return; timeout 80 python3 -m bench.serve_bench --gpu --phases c64 --rounds 2 --out /tmp/r/$n "$@" \
  > /tmp/r/$n.txt 2>&1; kill_stack; rm -rf /tmp/r/$n/logs; grep -E "c64:" /tmp/r/$n.txt | cut -c1-170; pack
  echo "$n after $(( $(date +%s) - TS )) s"; }
S gate1; S nogate1 --scheduler-flags=--no-arrival-gate; S asyncio1 "--gateway-flags=--loop asyncio --http h11"
S gate2; S nogate2 --scheduler-flags=--no-arrival-gate; S asyncio2 "--gateway-flags=--loop asyncio --http h11"
ok 540 && timeout 60 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --context 1152 --batches 64 \
  --decode-steps 8 --prefill "" --profile /tmp/r/prof > /tmp/r/prof.txt 2>&1 && grep -E "replay alone" /tmp/r/prof.txt
[ -f /tmp/r/prof/trace-b64.json.gz ] && python3 -m bench.kernel_breakdown /tmp/r/prof/trace-b64.json.gz --weight-gb 2.04 \
  --kv-gb 0.906 --hbm-tbs 3.35 --json /tmp/r/breakdown_b64.json | tee /tmp/r/breakdown_b64.txt
rm -f /tmp/r/prof/trace-*.json.gz.tmp; pack
echo "done after $(( $(date +%s) - TS )) s"
