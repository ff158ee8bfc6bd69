#!/bin/bash
# H200 run 15 call 2: (1) what one gRPC call and the cache's Match cost on this host (probe_rpc.py, probe_match.py,
# bench.cache_bench, bench.keystroke_cache_cost); (2) the editor (tiny, 20 typists, PSM, 15 s, hop trace, switch
# interval 100 us) alternating the gateway's HTTP stack: uvicorn on asyncio + h11 (today) against uvloop + httptools
# (uvicorn's "standard" extras, picked by its "auto"); then uvloop + httptools with the switch interval at 30 us.
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
python3 -m pip install -q --no-index --no-deps --target /tmp/site_uv .whl/uv/*.whl && echo "uv wheels in /tmp/site_uv"
D=bench/results/h200-run15
timeout 60 python3 $D/probe_rpc.py 2>&1 | grep -v "^{" | tee /tmp/r/probe_rpc.txt
timeout 60 python3 $D/probe_match.py 2>&1 | tee /tmp/r/probe_match.txt
timeout 100 python3 -m bench.cache_bench 2>&1 | tail -4 | tee /tmp/r/cache_bench.txt
timeout 100 python3 -m bench.keystroke_cache_cost 2>&1 | tail -1 | tee /tmp/r/keystroke_cache_cost.txt
pack; echo "probes after $(( $(date +%s) - T0 )) s"
E() { n=$1; shift; timeout 70 python3 -m bench.editor_bench --gpu --context-files 4 --modes psm --duration 15 --typists 20 \
        --hop-trace /tmp/hops_$n --out /tmp/r/ed_$n "$@" > /tmp/r/editor_$n.txt 2>&1; kill_stack; rm -rf /tmp/r/ed_$n/logs
      python3 -m bench.hop_report /tmp/hops_$n > /tmp/r/ed_$n/hops.txt; tail -1 /tmp/r/editor_$n.txt | cut -c1-250
      grep -E "http_in|call|first_message|first_chunk|total" /tmp/r/ed_$n/hops.txt; echo "editor $n after $(( $(date +%s) - T0 )) s"; pack; }
export CODESERVE_SWITCH_INTERVAL_US=100
BASE=$PYTHONPATH
E h11_1
PYTHONPATH=/tmp/site_uv:$BASE E uv_1
E h11_2
PYTHONPATH=/tmp/site_uv:$BASE E uv_2
CODESERVE_SWITCH_INTERVAL_US=30 PYTHONPATH=/tmp/site_uv:$BASE E uv_30us
echo "done after $(( $(date +%s) - T0 )) s"
