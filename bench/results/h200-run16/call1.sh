#!/bin/bash
# H200 run 16 call 1: (1) tests/worker/test_gpu.py; (2) what a gRPC call costs with grpcio's EventEngine client and
# listener (1.85's default) and with them off (GRPC_EXPERIMENTS), a trivial call and the cache's Match; (3) the editor
# (tiny, 20 typists, PSM, 15 s, hop trace) alternated: defaults / EventEngine off, twice.
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nproc; grep "model name" /proc/cpuinfo | head -1
timeout 240 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py 2>&1 | tail -4 | tee /tmp/r/test_gpu.txt
pkill -9 -f pytest; pack; echo "tests after $(( $(date +%s) - T0 )) s"
EXP="-event_engine_client,-event_engine_listener"
for i in 1 2; do
  for e in "" "$EXP"; do
    echo "probe [$e] $(GRPC_EXPERIMENTS="$e" timeout 60 python3 bench/results/h200-run16/probe_grpc.py client 2>&1 | grep -v "^E0\|WARN\|^$" | tr '\n' ' ')" | tee -a /tmp/r/probe.txt
    echo "cache [$e] $(GRPC_EXPERIMENTS="$e" timeout 60 python3 bench/results/h200-run15/probe_rpc.py 2>&1 | grep -v "^E0\|WARN\|^$" | tr '\n' ' ')" | tee -a /tmp/r/probe.txt
  done
done
pack; echo "probes after $(( $(date +%s) - T0 )) s"
E() { n=$1; shift; GRPC_EXPERIMENTS="$1" timeout 70 python3 -m bench.editor_bench --gpu --context-files 4 --modes psm --duration 15 --typists 20 \
        --hop-trace /tmp/hops_$n --out /tmp/r/ed_$n > /tmp/r/editor_$n.txt 2>&1; kill_stack; rm -rf /tmp/r/ed_$n/logs
      python3 -m bench.hop_report /tmp/hops_$n > /tmp/r/ed_$n/hops.txt; echo "[$1] $(tail -1 /tmp/r/editor_$n.txt | cut -c1-250)"
      grep -E "call ->|-> cache_in|match_back|forward_in|extend_reply|first_message|total" /tmp/r/ed_$n/hops.txt; echo "editor $n after $(( $(date +%s) - T0 )) s"; pack; }
export CODESERVE_SWITCH_INTERVAL_US=100
E a ""
E b "$EXP"
E c ""
E d "$EXP"
echo "done after $(( $(date +%s) - T0 )) s"
