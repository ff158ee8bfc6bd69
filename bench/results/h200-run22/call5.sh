#!/bin/bash
# Run 22 call 5 (written in session 22 for the next session's first call; carry [".whl"], or [".whl", ".jit"] where a
# .jit exists: without one it builds the JIT cache and returns it as $OUT/jit.part*; ~8 min). Prologue:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null;
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MAX_JOBS=16; bash bench/results/h200-run22/call5.sh > $OUT/log.txt 2>&1
# (1) GPU tests of session 22's new code: the decode attention's merge by the last CTA (test_gpu.py -k mqa) and
#     DecodeGemms.only (test_gpu_skinny_gemm.py -k only);
# (2) worker bench 1B B = 16 / 32 / 64: --attn-fused-merge against the merge kernel, alternated twice;
# (3) the same with 128 KV rows a loop step, and with 3 stages (at decode_config's new splits);
# (4) worker bench 1B B = 1 / 64: the split-K GEMM (PDL, weights prefetched before the wait) for c_attn and
#     attn.c_proj only (the 8-9 MB projections cuBLAS reads at 1.4 TB/s) / for all / none (cuBLAS, the default);
# (5) serve_bench c64: the splits rule before (mqa_decode_splits9.py) then after, the order call 4 did not run.
mkdir -p /tmp/r
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ ! -d .jit ]; then
  timeout 300 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --batches 1,64 --prefill 16,1024 \
    --iters 1 --decode-steps 8 > /tmp/r/warm.txt 2>&1; tail -3 /tmp/r/warm.txt
  (cd ~ && tar czf /tmp/jit.tgz .cache/flashinfer .triton 2>/dev/null) && split -b 15000000 -d /tmp/jit.tgz $OUT/jit.part
  echo "jit cache built after $(( $(date +%s) - TS )) s"
fi
timeout 120 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py -k mqa \
  tests/worker/test_gpu_skinny_gemm.py > /tmp/r/tests.txt 2>&1
tail -4 /tmp/r/tests.txt; pkill -9 -f pytest; pack; echo "tests after $(( $(date +%s) - TS )) s"
A() { n=$1; shift; ok 520 || return; timeout 60 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --context 1152 \
  --decode-steps 8 --prefill "" --json-out /tmp/r/a_$n.json "$@" > /tmp/r/a_$n.txt 2>&1; echo "$n:"; grep -E 'replay alone' /tmp/r/a_$n.txt; }
A merge_kernel1 --batches 16,32,64; A fused_merge1 --batches 16,32,64 --attn-fused-merge
A merge_kernel2 --batches 16,32,64; A fused_merge2 --batches 16,32,64 --attn-fused-merge
A block128 --batches 16,32,64 --attn-block-n 128; A stages3 --batches 16,32,64 --attn-stages 3
pack; echo "attention after $(( $(date +%s) - TS )) s"
A cublas --batches 1,64; A splitk_attn --batches 1,64 --splitk-rows 64 --splitk-only c_attn,attn.c_proj
A splitk_all --batches 1,64 --splitk-rows 64; A cublas2 --batches 1,64
pack; echo "gemms after $(( $(date +%s) - TS )) s"
cp worker_svc/attention/mqa_decode.py /tmp/mqa_new.py
S() { n=$1; ok 500 || return; timeout 75 python3 -m bench.serve_bench --gpu --phases c64 --rounds 2 --out /tmp/r/$n > /tmp/r/$n.txt 2>&1
  kill_stack; rm -rf /tmp/r/$n/logs; grep -E "c64:" /tmp/r/$n.txt | cut -c1-160; pack; echo "$n after $(( $(date +%s) - TS )) s"; }
cp bench/results/h200-run22/mqa_decode_splits9.py worker_svc/attention/mqa_decode.py; S sold3
cp /tmp/mqa_new.py worker_svc/attention/mqa_decode.py; S snew3
echo "done after $(( $(date +%s) - TS )) s"
