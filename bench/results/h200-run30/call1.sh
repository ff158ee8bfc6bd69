#!/bin/bash
# Session 30 call 1 (run 29's targets.sh): the GPU tests first, then run 24 call 2 again (every default against issue 15 targets, grpc.aio scheduler), after a kill of any stack left over.
# default, on whatever card came (the log's first line names it): (1) serve_bench 1B hf,c64,c256,c1 with transformers'
# compiled static generate in the same run; (2) worker bench 1B B = 1 / 64 / 256, prefill 1,024 and 8,192; tiny B = 1 /
# 64, prefill 1,024; (3) tests/worker/test_gpu.py whole and test_gpu_extend_behind.py, test_gpu_fused.py, test_plan_ring.py (not all run on a GPU yet).
mkdir -p /tmp/r; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 250 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py tests/worker/test_gpu_extend_behind.py tests/worker/test_gpu_fused.py tests/worker/test_plan_ring.py \
  > /tmp/r/tests.txt 2>&1; tail -5 /tmp/r/tests.txt
pack; echo "tests after $(( $(date +%s) - TS )) s"
timeout 240 python3 -m bench.serve_bench --gpu --phases hf,c64,c256,c1 --c1-requests 5 --hf-baselines static_compiled \
  --out /tmp/r/serve > /tmp/r/serve.txt 2>&1
kill_stack; rm -rf /tmp/r/serve/logs; grep -E "c64:|c256:|c1:|static_compiled:" /tmp/r/serve.txt | cut -c1-260
pack; echo "serve after $(( $(date +%s) - TS )) s"
W() { n=$1; shift; ok $1 || return; shift; timeout 90 python3 -m worker_svc.bench --dtype bfloat16 --decode-steps 8 \
  --json-out /tmp/r/w_$n.json "$@" > /tmp/r/w_$n.txt 2>&1; echo "$n:"; grep -E "replay alone|prefill" /tmp/r/w_$n.txt | cut -c1-200; }
W 1b 470 --shape starcoderbase-1b --context 1152 --batches 1,64,256 --prefill 1024,8192
W tiny 500 --shape tiny_starcoder_py --context 1152 --batches 1,64 --prefill 1024
pack; echo "worker after $(( $(date +%s) - TS )) s"
pack; echo "done after $(( $(date +%s) - TS )) s"
# the B = 64 decode step's kernels on this card (run 25 call 4's command)
ok 540 && timeout 120 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --decode-steps 8 --context 1152 \
  --batches 64 --prefill "" --profile /tmp/r/prof > /tmp/r/prof.txt 2>&1 && \
  python3 -m bench.kernel_breakdown $(ls /tmp/r/prof/*.json* | head -1) --hbm-tbs 4.8 > /tmp/r/breakdown_1b_b64.txt 2>&1; head -40 /tmp/r/breakdown_1b_b64.txt
pack; echo "profile after $(( $(date +%s) - TS )) s"
# c64 with every request's hops traced: where the wave boundary's idle time and the tail go now (run 20's tools)
ok 560 && { timeout 100 python3 -m bench.serve_bench --gpu --phases c64 --out /tmp/r/hop --hop-trace /tmp/r/hops > /tmp/r/hop.txt 2>&1
  kill_stack; rm -rf /tmp/r/hop/logs; grep -E "c64:" /tmp/r/hop.txt | cut -c1-250
  python3 -m bench.wave_report /tmp/r/hop/forwards.tsv /tmp/r/hops --min-gap-ms 5 > /tmp/r/waves.txt 2>&1; head -50 /tmp/r/waves.txt
  python3 -m bench.hop_report /tmp/r/hops --last client_done > /tmp/r/hops.txt 2>&1; head -40 /tmp/r/hops.txt
  tar czf /tmp/r/hops.tgz -C /tmp/r hops && rm -rf /tmp/r/hops; pack; echo "hops after $(( $(date +%s) - TS )) s"; }
