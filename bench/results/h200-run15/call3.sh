#!/bin/bash
# H200 run 15 call 3: (1) bench.keystroke_cache_cost with the cache's insert walking from the request's locked node
# (call 2: the root); (2) the editor three times (tiny, 20 typists, PSM, 15 s, hop trace with the cache's cache_in
# mark, switch interval 100 us); (3) issue 15: the 1B decode step at B = 64 profiled with and without programmatic
# dependent launches (with PDL a kernel's span includes its wait for the one ahead: is the split-KV merge's 21 us a
# layer real?).
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
      grep -E "match|cache_in|total" /tmp/r/ed_$n/hops.txt; echo "editor $n after $(( $(date +%s) - T0 )) s"; pack; }
export CODESERVE_SWITCH_INTERVAL_US=100
E a
E b
E c
unset CODESERVE_SWITCH_INTERVAL_US
for pdl in pdl no-pdl; do
  timeout 150 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --batches 64 --context 1152 \
    --decode-steps 8 --$pdl --profile /tmp/r/prof_$pdl --json-out /tmp/r/w_$pdl.json 2>&1 | grep -v -i warn | tail -4
  echo "worker bench $pdl after $(( $(date +%s) - T0 )) s"; pack
done
echo "done after $(( $(date +%s) - T0 )) s"
