#!/bin/bash
# Session 33, fourth call (same warm H100 as calls 1-3): c256 alone, three arms alternated three times, since calls 2
# and 3 showed c256 varying 24.8k-29.1k tok/s between runs of the same arm: the default, --chain-depth 2 (scheduler),
# --decode-attention triton (worker; x0.93 of flashinfer's GPU time at 128 and 256 rows in call 3's worker bench).
mkdir -p /tmp/r7; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && [ ! -d ~/.cache/flashinfer ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
TS=$(date +%s)
arm() { name=$1; sf=$2; wf=$3; [ $(( $(date +%s) - TS )) -lt 420 ] || return
  timeout 100 python3 -m bench.serve_bench --gpu --phases c256 --out /tmp/r7/$name --scheduler-flags="$sf" --worker-flags="$wf" > /tmp/r7/$name.txt 2>&1
  pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
  echo "== $name ($sf $wf) after $(( $(date +%s) - TS )) s"; grep -E "c256:" /tmp/r7/$name.txt | cut -c24-200
  python3 -m bench.forward_timeline /tmp/r7/$name/forwards.tsv 2>&1 | grep -E "segment|gap decode->decode" | tail -2
  rm -rf /tmp/r7/$name/logs; tar czf $OUT/r7.tgz -C /tmp/r7 .; }
for i in 1 2 3; do arm base$i "" ""; arm d2_$i "--chain-depth 2" ""; arm tri$i "" "--decode-attention triton"; done
echo "done after $(( $(date +%s) - TS )) s"
