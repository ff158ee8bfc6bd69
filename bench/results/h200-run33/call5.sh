#!/bin/bash
# Session 33, fifth call (same warm H100): call4.sh's arms again, the default against --chain-depth 2 alternated, and both
# with the Triton decode attention (call 4: d2_3 and tri3 had the fewest decode gaps of all arms).
mkdir -p /tmp/r7; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && [ ! -d ~/.cache/flashinfer ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
TS=$(date +%s)
arm() { name=$1; sf=$2; wf=$3; [ $(( $(date +%s) - TS )) -lt 290 ] || return
  timeout 100 python3 -m bench.serve_bench --gpu --phases c256 --out /tmp/r7/$name --scheduler-flags="$sf" --worker-flags="$wf" > /tmp/r7/$name.txt 2>&1
  pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
  echo "== $name ($sf $wf) after $(( $(date +%s) - TS )) s"; grep -E "c256:" /tmp/r7/$name.txt | cut -c24-200
  python3 -m bench.forward_timeline /tmp/r7/$name/forwards.tsv 2>&1 | grep -E "segment|gap decode->decode" | tail -2
  rm -rf /tmp/r7/$name/logs; tar czf $OUT/r7.tgz -C /tmp/r7 .; }
for i in 4 5; do arm base$i "" ""; arm d2_$i "--chain-depth 2" ""; done; arm d2tri "--chain-depth 2" "--decode-attention triton"
echo "done after $(( $(date +%s) - TS )) s"
