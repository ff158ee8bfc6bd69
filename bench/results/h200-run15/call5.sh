#!/bin/bash
# H200 run 15 call 5: the editor (tiny, 20 typists, PSM, 15 s, hop trace, switch interval 100 us) three times with
# the ids copied repeated field to repeated field (Req.extend_ids; the gateway's unused prompt-id copy gone) and the
# cache's inserts from the locked node; then bench.keystroke_cache_cost for this host's speed.
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
timeout 100 python3 -m bench.keystroke_cache_cost 2>&1 | tail -1 | tee /tmp/r/keystroke_cache_cost.txt
E() { n=$1; shift; timeout 70 python3 -m bench.editor_bench --gpu --context-files 4 --modes psm --duration 15 --typists 20 \
        --hop-trace /tmp/hops_$n --out /tmp/r/ed_$n "$@" > /tmp/r/editor_$n.txt 2>&1; kill_stack; rm -rf /tmp/r/ed_$n/logs
      python3 -m bench.hop_report /tmp/hops_$n > /tmp/r/ed_$n/hops.txt; tail -1 /tmp/r/editor_$n.txt | cut -c1-250
      grep -E "match_sent|admitted ->|first_token|first_yield|first_message|total" /tmp/r/ed_$n/hops.txt; echo "editor $n after $(( $(date +%s) - T0 )) s"; pack; }
export CODESERVE_SWITCH_INTERVAL_US=100
E a
E b
E c
echo "done after $(( $(date +%s) - T0 )) s"
