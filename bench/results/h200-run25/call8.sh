#!/bin/bash
# For the next session's first call (carry [".whl", ".jit"]; prologue as call2.sh; ~5 min): (1) the 1B's 8,192-token
# eager extend profiled (where its 41 ms go: GEMMs, the single 8,192-token causal attention, host) — the prefill target
# (>= 600 TFLOP/s) is 564 in run 25; (2) serve_bench c64 with --hop-trace: the second wave's arrival spread hop by
# hop on this machine (run 25's H200 timeline: ~96 ms of idle between the waves, bench/README.md "Run 25");
# (3) the gateway in 4 processes (--workers 4, gateway/workers.py) against 1 on c64, alternated twice (the wave
# boundary's arrival spread). call9.sh: the GPU tests in full.
mkdir -p /tmp/r
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --batches 1 --cuda-graph-max-batch 8 \
  --prefill 8192 --profile /tmp/r/prof > /tmp/r/prefill.txt 2>&1; grep prefill /tmp/r/prefill.txt
for t in /tmp/r/prof/trace-prefill8192*.json; do python3 -m bench.kernel_breakdown $t --steps 1 > $t.breakdown.txt 2>&1; head -12 $t.breakdown.txt; gzip $t; done
pack
ok 200 && timeout 100 python3 -m bench.serve_bench --gpu --phases c64 --out /tmp/r/hop --hop-trace /tmp/r/hops > /tmp/r/hop.txt 2>&1
kill_stack; grep -E "c64:" /tmp/r/hop.txt | cut -c1-200; rm -rf /tmp/r/hop/logs
python3 -m bench.wave_report /tmp/r/hop/forwards.tsv /tmp/r/hops > /tmp/r/waves.txt 2>&1; head -40 /tmp/r/waves.txt
python3 -m bench.hop_report /tmp/r/hops --last client_done > /tmp/r/hops.txt 2>&1; tar czf /tmp/r/hops.tgz -C /tmp/r hops; rm -rf /tmp/r/hops
pack
S() { n=$1; shift; ok 480 || return; timeout 70 python3 -m bench.serve_bench --gpu --phases c64 --out /tmp/r/$n "$@" \
  > /tmp/r/$n.txt 2>&1; kill_stack; rm -rf /tmp/r/$n/logs; echo "$n: $(grep -E 'c64:' /tmp/r/$n.txt | cut -c1-150)"; pack; }
S w1a; S w4a --gateway-flags=--workers=4; S w1b; S w4b --gateway-flags=--workers=4
pack; echo "done after $(( $(date +%s) - TS )) s"
