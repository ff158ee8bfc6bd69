#!/bin/bash
# H200 run 21 call 2 (carry [".whl", ".jit"]; prologue as call 1):
# (1) serve_bench 1B c64 --rounds 3: attention metadata copied to the device through page-locked memory (this commit)
#     / from pageable memory (base_pageable.py, the commit before, swapped in for its runs), alternated, 2 pairs: does
#     the chained extend -> extend gap (~3 ms in call 1) close;
# (2) tests/worker/test_gpu_extend_behind.py (the enqueued extend on CUDA) and the engine-level tests of
#     test_gpu_ragged.py (default model: flashinfer compiles head_dim 64 kernels, bf16 and fp16);
# (3) the JIT cache packed into $OUT/jit.tgz (the next calls and sessions carry it as .jit).
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
S() { n=$1; shift; timeout 90 python3 -m bench.serve_bench --gpu --phases c64 --rounds 3 --out /tmp/r/$n "$@" > /tmp/r/$n.txt 2>&1
  kill_stack; rm -rf /tmp/r/$n/logs; grep -E "c64:" /tmp/r/$n.txt | cut -c1-250
  python3 -m bench.forward_timeline /tmp/r/$n/forwards.tsv --json /tmp/r/fwd_$n.json > /tmp/r/fwd_$n.txt; grep -A8 "^segment 1" /tmp/r/fwd_$n.txt
  pack; echo "$n after $(( $(date +%s) - T0 )) s"; }
NEW=/tmp/base_pinned.py; cp worker_svc/attention/base.py $NEW
old() { cp bench/results/h200-run21/base_pageable.py worker_svc/attention/base.py; }
new() { cp $NEW worker_svc/attention/base.py; }
S pinned1; old; S pageable1; new
S pinned2; old; S pageable2; new
cmp $NEW worker_svc/attention/base.py && echo "pinned base.py back"
timeout $(( 560 - $(date +%s) + T0 )) python3 -m pytest -o addopts="" -q -p no:warnings -rf --durations=8 \
  tests/worker/test_gpu_extend_behind.py tests/worker/test_gpu_ragged.py \
  -k "cuda or forward_on_the_ragged or served_greedy or mixing or hf_fp32" > /tmp/r/tests.txt 2>&1
tail -25 /tmp/r/tests.txt; pkill -9 -f pytest; pack
tar czf $OUT/jit.tgz -C ~ .cache/flashinfer .triton; ls -la $OUT/jit.tgz
echo "done after $(( $(date +%s) - T0 )) s"
