#!/bin/bash
# Session 33, second call (same warm machine as call1.sh; prologue as call1.sh). The A/B of the scheduler's
# --chain-depth 2 (new: decode N+2 sent once N's reply is in, before N is applied, scheduler_svc/chain.py chain_ahead)
# against 1 (the default), c64 and c256, alternated twice; the decode -> decode gaps of each arm from its Forward
# timeline, and the 256-row decodes one by one (arrival against the end of the Forward ahead: did they launch behind?).
mkdir -p /tmp/r6; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && [ ! -d ~/.cache/flashinfer ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
TS=$(date +%s)
arm() { name=$1; shift; [ $(( $(date +%s) - TS )) -lt 440 ] || return
  timeout 135 python3 -m bench.serve_bench --gpu --phases c64,c256 --out /tmp/r6/$name --scheduler-flags="$*" > /tmp/r6/$name.txt 2>&1
  pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
  echo "== $name ($*) after $(( $(date +%s) - TS )) s"; grep -E "c64:|c256:" /tmp/r6/$name.txt | cut -c24-230
  python3 -m bench.forward_timeline /tmp/r6/$name/forwards.tsv 2>&1 | grep -E "segment|gap decode->decode|stages decode" | tail -6
  python3 -m bench.forward_timeline /tmp/r6/$name/forwards.tsv --list decode:129 > /tmp/r6/${name}_decodes.txt 2>&1
  rm -rf /tmp/r6/$name/logs; tar czf $OUT/r6.tgz -C /tmp/r6 .; }
arm d1a --chain-depth 1
arm d2a --chain-depth 2
arm d1b --chain-depth 1
arm d2b --chain-depth 2
echo "done after $(( $(date +%s) - TS )) s"
