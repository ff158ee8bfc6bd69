#!/bin/bash
# H200 run 17 call 3: (1) the editor (tiny, 20 typists, PSM, 15 s, hop trace) with launch behind (the default) and
# without (--worker-flags=--no-launch-behind), alternated twice: an arrival's extend that reaches the worker after a
# decode Forward was launched behind runs after it; (2) serve_bench 1B c64 x 4 rounds with the Forward timeline and
# py-spy (--gil) on the scheduler and the cache: what the scheduler does between two decode Forwards at c64.
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
[ -x /tmp/spy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy*.whl
rm -rf /tmp/hops_*
E() { n=$1; label=$2; shift 2; timeout 70 python3 -m bench.editor_bench --gpu --context-files 4 --modes psm --duration 15 --typists 20 \
        --hop-trace /tmp/hops_$n --out /tmp/r/ed_$n "$@" > /tmp/r/editor_$n.txt 2>&1; kill_stack; rm -rf /tmp/r/ed_$n/logs
      python3 -m bench.hop_report /tmp/hops_$n > /tmp/r/ed_$n/hops.txt; echo "[$label] $(tail -1 /tmp/r/editor_$n.txt | cut -c1-250)"
      grep -E "extend_sent|forward_in|forward_run|forward_out|total" /tmp/r/ed_$n/hops.txt; echo "editor $n after $(( $(date +%s) - T0 )) s"; pack; }
export CODESERVE_SWITCH_INTERVAL_US=100
for i in 1 2; do
  E behind$i behind
  E turn$i turn --worker-flags=--no-launch-behind
done
unset CODESERVE_SWITCH_INTERVAL_US
mkdir -p /tmp/r/spy
CODESERVE_FORWARD_LOG=/tmp/r/fwd_c64x4.tsv timeout 200 python3 -m bench.serve_bench --gpu --phases c64 --rounds 4 \
  --out /tmp/r/serve_c64x4 > /tmp/r/serve_c64x4.txt 2>&1 &
B=$!
for i in $(seq 120); do [ -s /tmp/r/fwd_c64x4.tsv ] && break; sleep 0.5; done; echo "timeline started after $i half-seconds"
for s in scheduler_svc cache_svc; do
  p=$(pgrep -f -- "-m $s" | head -1)
  [ -n "$p" ] && timeout 40 /tmp/spy/bin/py-spy record -p $p -d 12 -r 500 --gil -f raw -o /tmp/r/spy/$s.txt > /tmp/r/spy/$s.log 2>&1 &
done
wait $B; wait; kill_stack; rm -rf /tmp/r/serve_c64x4/logs; gzip -f /tmp/r/spy/*.txt
grep -E "c64:" /tmp/r/serve_c64x4.txt | cut -c1-600
python3 -m bench.forward_timeline /tmp/r/fwd_c64x4.tsv --json /tmp/r/fwd_c64x4.json | tee /tmp/r/fwd_c64x4.txt
pack; echo "done after $(( $(date +%s) - T0 )) s"
