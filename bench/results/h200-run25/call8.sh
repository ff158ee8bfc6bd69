#!/bin/bash
# For the next session's first call (carry [".whl", ".jit"]; prologue as call2.sh; ~5 min): (1) the 1B's 8,192-token
# eager extend profiled (where its 41 ms go: GEMMs, the single 8,192-token causal attention, host) — the prefill target
# (>= 600 TFLOP/s) is 564 in run 25; (2) serve_bench c64 with --hop-trace: the second wave's arrival spread hop by
# hop on this machine (run 25's H200 timeline: ~96 ms of idle between the waves, bench/README.md "Run 25");
# (3) the GPU tests after run 25's changes (the tiny model's split-K limit of 16 rows: test_gpu_whole_graph's served
# tokens cover it; the experiments' removal), in full.
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
ok 330 && timeout 250 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py \
  tests/worker/test_gpu_whole_graph.py tests/worker/test_gpu_fused.py tests/worker/test_gpu_skinny_gemm.py \
  > /tmp/r/tests.txt 2>&1; tail -3 /tmp/r/tests.txt
pack; echo "done after $(( $(date +%s) - TS )) s"
