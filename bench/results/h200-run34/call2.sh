#!/bin/bash
# Written in session 33 for session 34's second call (same warm machine as call1.sh; prologue as call1.sh). c64 and
# c256 (--rounds 2 each) in six arms, alternated twice: the default; the worker's thread switch interval at 1 ms
# (--switch-interval-us, new: run 33 read ~9 ms from a device's end to the next Forward's turn at c256, the
# commit ahead building its reply on another thread with the GIL; run 14 lost c64 with every service at 100 us, the
# scheduler's loop preempted, so the worker alone here); the Triton decode attention in the 1B's 128- and 256-row
# buckets too (x0.93 of flashinfer's GPU time on the H100 in run 33's worker bench, not resolved end to end); the
# worker's --hold-commit-ms 8 (new: N's commit waits for an N+1 still preparing to launch behind it); the scheduler's
# --decode-steps 16 (half the Forward boundaries of c256, each ~10 ms of idle device when a Forward takes its turn).
# Last, --hold-commit-ms 8 with the scheduler's --chain-depth 2 (even with depth 1 in run 33; its Forwards arrive
# earlier, which a held commit may turn into launches behind). Arms in order of priority: the guard cuts the last ones
# of the second round first.
mkdir -p /tmp/r2; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && [ ! -d ~/.cache/flashinfer ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
TS=$(date +%s)
arm() { name=$1; wf=$2; sf=$3; [ $(( $(date +%s) - TS )) -lt 510 ] || return
  timeout 80 python3 -m bench.serve_bench --gpu --phases c64,c256 --rounds 2 --out /tmp/r2/$name --worker-flags="$wf" \
    --scheduler-flags="$sf" > /tmp/r2/$name.txt 2>&1
  pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
  echo "== $name ($wf $sf) after $(( $(date +%s) - TS )) s"; grep -E "c64:|c256:" /tmp/r2/$name.txt | cut -c24-200
  python3 -m bench.forward_timeline /tmp/r2/$name/forwards.tsv 2>&1 | grep -E "segment|gap decode->decode" | tail -4
  python3 -m bench.forward_timeline /tmp/r2/$name/forwards.tsv --list decode:129 | tail -1
  python3 -m bench.forward_timeline /tmp/r2/$name/forwards.tsv --list decode:129 > /tmp/r2/${name}_decodes.txt 2>&1
  rm -rf /tmp/r2/$name/logs; tar czf $OUT/r2.tgz -C /tmp/r2 .; }
for i in 1 2; do arm base$i "" ""; arm hold8_$i "--hold-commit-ms 8" ""; arm sw1000_$i "--switch-interval-us 1000" ""
  arm k16_$i "" "--decode-steps 16"; arm tri$i "--decode-attention triton" ""; arm hd2_$i "--hold-commit-ms 8" "--chain-depth 2"; done
echo "done after $(( $(date +%s) - TS )) s"
