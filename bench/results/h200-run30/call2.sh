#!/bin/bash
# Session 30 call 2 (carry and prologue as call 1): the A/B's next pairs, the B = 64 decode step's kernels.
mkdir -p /tmp/r; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
rm -rf /tmp/base && mkdir /tmp/base && tar cf - --exclude=./.whl --exclude=./.jit2 --exclude=./.baseline --exclude=./bench/results . \
  | tar xf - -C /tmp/base && rm -rf /tmp/base/scheduler_svc && cp -r .baseline/scheduler_svc /tmp/base/ && cp -r .baseline/worker_svc/. /tmp/base/worker_svc/
AB() { name=$1; dir=$2; ok $3 || return; (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 60 python3 -m bench.serve_bench --gpu --phases c64,c256 \
  --out /tmp/r/$name > /tmp/r/$name.txt 2>&1); kill_stack; rm -rf /tmp/r/$name/logs; echo "== $name"; grep -E "c64:|c256:" /tmp/r/$name.txt | cut -c24-200
  python3 -m bench.forward_timeline /tmp/r/$name/forwards.tsv 2>&1 | grep -E "^segment [12]|gap extend->decode" | head -6; pack; }
AB base2 /tmp/base 400; AB new2 $PWD 460; AB base3 /tmp/base 520; AB new3 $PWD 520
ok 540 && timeout 60 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --decode-steps 8 --context 1152 \
  --batches 64 --prefill "" --profile /tmp/r/prof > /tmp/r/prof.txt 2>&1 && \
  python3 -m bench.kernel_breakdown $(ls /tmp/r/prof/*.json* | head -1) --hbm-tbs 4.8 > /tmp/r/breakdown_1b_b64.txt 2>&1; head -14 /tmp/r/breakdown_1b_b64.txt
pack; echo "done after $(( $(date +%s) - TS )) s"
