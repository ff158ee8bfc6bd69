#!/bin/bash
# Run 23 call 2 (carry [".whl", ".jit"]; prologue as call1.sh). (1) serve_bench c64 with --hop-trace (the arrival gate
# on): where a wave boundary's idle time goes now (bench.wave_report, bench.hop_report); (2) the arrival gate A/B
# again, in the other order: --no-arrival-gate first, alternated twice.
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
S hop --hop-trace /tmp/r/hops
python3 -m bench.wave_report /tmp/r/hop/forwards.tsv /tmp/r/hops > /tmp/r/waves.txt 2>&1; head -50 /tmp/r/waves.txt
python3 -m bench.hop_report /tmp/r/hops --last client_done > /tmp/r/hops.txt 2>&1; tar czf /tmp/r/hops.tgz -C /tmp/r hops; rm -rf /tmp/r/hops
S nogate3 --scheduler-flags=--no-arrival-gate; S gate3; S nogate4 --scheduler-flags=--no-arrival-gate; S gate4
echo "done after $(( $(date +%s) - TS )) s"
