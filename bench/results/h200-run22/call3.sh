#!/bin/bash
# H200 run 22 call 3 (for the session after session 21; carry [".whl", ".jit"], after call 2 returned the JIT cache;
# prologue as call 1's): the wave's end with the loop letting the streams take their last messages first
# (--scheduler-flags=--wave-end-yield-ms=10, scheduler_svc/wave_end.py) against without (default), serve_bench 1B c64
# --rounds 2, alternated; the first pair with --hop-trace (final_message -> last_yield, client_sent -> forward_in);
# first tests/worker/test_gpu.py, then (session 22) the attention splits sweep.
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
# tests/worker/test_gpu.py after session 21's worker changes (the sampler, the eager multi-step plan wait): not run
# on a GPU in that session
timeout 300 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py > /tmp/r/test_gpu.txt 2>&1
tail -8 /tmp/r/test_gpu.txt; pkill -9 -f pytest; pack; echo "test_gpu after $(( $(date +%s) - T0 )) s"; T0=$(date +%s)
S() { n=$1; shift; timeout 90 python3 -m bench.serve_bench --gpu --phases c64 --rounds 2 --out /tmp/r/$n "$@" > /tmp/r/$n.txt 2>&1
  kill_stack; rm -rf /tmp/r/$n/logs; grep -E "c64:" /tmp/r/$n.txt | cut -c1-200; grep -o '"wave_end_yields": [0-9]*' /tmp/r/$n.txt | tail -1
  python3 -m bench.forward_timeline /tmp/r/$n/forwards.tsv --json /tmp/r/fwd_$n.json > /tmp/r/fwd_$n.txt; grep -A8 "^segment 1" /tmp/r/fwd_$n.txt
  pack; echo "$n after $(( $(date +%s) - T0 )) s"; }
# the Triton decode attention's KV splits in the graphs (call 2 on an H100: B = 64 9 splits 2.06 ms, 6 2.00, 4 1.96):
# B = 16 / 32 / 64, every bucket forced to N splits (decode_config: 32 / 17 / 9), the GPU time of a decode step
A() { n=$1; shift; timeout 60 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --context 1152 --decode-steps 8 \
  --batches 16,32,64 --prefill "" --json-out /tmp/r/a_$n.json "$@" > /tmp/r/a_$n.txt 2>&1; echo "$n:"; grep -E 'replay alone' /tmp/r/a_$n.txt; }
A splits_default; A splits2 --attn-splits 2; A splits3 --attn-splits 3; A splits4 --attn-splits 4; A splits6 --attn-splits 6
pack; echo "attention splits after $(( $(date +%s) - T0 )) s"
for arm in yield base; do
  flags=$([ $arm = yield ] && echo "--scheduler-flags=--wave-end-yield-ms=10")
  S ${arm}_hops $flags --hop-trace /tmp/r/hops_$arm
  python3 -m bench.wave_report /tmp/r/${arm}_hops/forwards.tsv /tmp/r/hops_$arm > /tmp/r/waves_$arm.txt; head -24 /tmp/r/waves_$arm.txt
  python3 -m bench.hop_report /tmp/r/hops_$arm --last client_done > /tmp/r/hops_$arm.txt
  tar czf /tmp/r/hops_$arm.tgz -C /tmp/r hops_$arm && rm -rf /tmp/r/hops_$arm; pack
done
left 330 && S yield2 --scheduler-flags=--wave-end-yield-ms=10
left 330 && S base2
echo "done after $(( $(date +%s) - T0 )) s"
