#!/bin/bash
# H200 run 17 call 4: the session's final code, every default: (1) the editor (tiny, 20 typists, PSM, 15 s, hop
# trace) three times; (2) serve_bench 1B hf,c64,c1 (transformers' compiled static generate in the same run) with the
# Forward timeline.
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
rm -rf /tmp/hops_*
E() { n=$1; shift; timeout 70 python3 -m bench.editor_bench --gpu --context-files 4 --modes psm --duration 15 --typists 20 \
        --hop-trace /tmp/hops_$n --out /tmp/r/ed_$n "$@" > /tmp/r/editor_$n.txt 2>&1; kill_stack; rm -rf /tmp/r/ed_$n/logs
      python3 -m bench.hop_report /tmp/hops_$n > /tmp/r/ed_$n/hops.txt; echo "[$n] $(tail -1 /tmp/r/editor_$n.txt | cut -c1-250)"
      grep -E "forward_run|total" /tmp/r/ed_$n/hops.txt; echo "editor $n after $(( $(date +%s) - T0 )) s"; pack; }
export CODESERVE_SWITCH_INTERVAL_US=100
for i in 1 2 3; do E final$i; done
unset CODESERVE_SWITCH_INTERVAL_US
CODESERVE_FORWARD_LOG=/tmp/r/fwd.tsv timeout 300 python3 -m bench.serve_bench --gpu --phases hf,c64,c1 --c1-requests 5 \
  --hf-baselines static_compiled --out /tmp/r/serve > /tmp/r/serve.txt 2>&1
kill_stack; rm -rf /tmp/r/serve/logs; grep -E "c64:|c1:|static_compiled:" /tmp/r/serve.txt | cut -c1-300; tail -12 /tmp/r/serve.txt
python3 -m bench.forward_timeline /tmp/r/fwd.tsv --json /tmp/r/fwd.json | tail -n +7 | tee /tmp/r/fwd.txt
pack; echo "done after $(( $(date +%s) - T0 )) s"
