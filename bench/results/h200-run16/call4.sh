#!/bin/bash
# H200 run 16 call 4 (the code after the review fixes: an early receipt only says yes, relief): the editor (tiny, 20 typists, PSM, 15 s, hop trace) alternated three times between the session's
# start (scheduler --no-early-match, GRPC_EXPERIMENTS="": grpcio's EventEngine client and listener) and this
# session's defaults (early Match, EventEngine off: common/grpc_env.py); then serve_bench (1B, c64 and c1, 10 c1
# requests) with the EventEngine on and off (call 3: the editor twice more each, no serve_bench).
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
rm -rf /tmp/hops_*
E() { n=$1; label=$2; shift 2; timeout 70 python3 -m bench.editor_bench --gpu --context-files 4 --modes psm --duration 15 --typists 20 \
        --hop-trace /tmp/hops_$n --out /tmp/r/ed_$n "$@" > /tmp/r/editor_$n.txt 2>&1; kill_stack; rm -rf /tmp/r/ed_$n/logs
      python3 -m bench.hop_report /tmp/hops_$n > /tmp/r/ed_$n/hops.txt; echo "[$label] $(tail -1 /tmp/r/editor_$n.txt | cut -c1-250)"
      grep -E "generate ->|taken ->|match_sent ->|match_back ->|extend_sent|forward_out|total" /tmp/r/ed_$n/hops.txt; echo "editor $n after $(( $(date +%s) - T0 )) s"; pack; }
export CODESERVE_SWITCH_INTERVAL_US=100
for i in 6 7; do
  GRPC_EXPERIMENTS="" E base$i base --scheduler-flags=--no-early-match
  E new$i new
done
E new8 new
echo "done after $(( $(date +%s) - T0 )) s"
