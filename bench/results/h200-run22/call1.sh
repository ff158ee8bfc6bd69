#!/bin/bash
# H200 run 22 call 1 (twentieth session; carry [".whl"], no JIT cache in this checkout; prologue: python3 -m pip
# install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
# PYTHONUNBUFFERED=1 MAX_JOBS=16; bash bench/results/h200-run22/call1.sh):
# (1) the JIT cache built (worker bench of the tiny and 1B shapes) and returned as $OUT/jit.part*;
# (2) bench/cublaslt_bench.py (new): every cuBLASLt heuristic candidate per decode projection, 1B and tiny;
# (3) tests/worker/test_gpu_cublaslt.py; worker bench 1B decode (B = 1, 64, 256) torch's GEMMs / --lt-rows 256;
# (4) run 21 call 4 again after its fix (arrivals behind the chained extend wait for one extend next round):
#     serve_bench 1B c64 --rounds 2, the first decode chained behind the extend that ends every prefill (default) /
#     after its reply (--scheduler-flags=--no-chain-after-extend), alternated while time is left.
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; lscpu | grep "Model name"
for s in starcoderbase-1b; do  # (the tiny shape's head_dim 64 kernels are left for a later call)
  timeout 300 python3 -m worker_svc.bench --shape $s --dtype bfloat16 --batches 1,64 --prefill 16,1024 --iters 1 --decode-steps 8 > /tmp/r/warm_$s.txt 2>&1 &
done
# the survey times CUDA graph replays on the GPU while the warm-up compiles on the CPU
for s in starcoderbase-1b; do  # every algorithm cuBLASLt's heuristic offers, against torch's GEMMs
  timeout 120 python3 -m bench.cublaslt_bench --shape $s --rows 1,64,256 --out /tmp/r/lt_$s > /tmp/r/lt_$s.txt 2>&1; tail -25 /tmp/r/lt_$s.txt
done; pack; echo "cublaslt after $(( $(date +%s) - T0 )) s"
wait; tail -3 /tmp/r/warm_*.txt; echo "warm after $(( $(date +%s) - T0 )) s"
(cd ~ && tar czf /tmp/jit.tgz .cache/flashinfer .triton 2>/dev/null) && split -b 15000000 -d /tmp/jit.tgz $OUT/jit.part; ls -la $OUT
timeout 120 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu_cublaslt.py > /tmp/r/test_gpu_cublaslt.txt 2>&1
tail -8 /tmp/r/test_gpu_cublaslt.txt; pkill -9 -f pytest; pack; echo "lt tests after $(( $(date +%s) - T0 )) s"
W() { n=$1; shift; timeout 100 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --context 1152 --decode-steps 8 \
  --batches 1,64,256 --prefill "" --json-out /tmp/r/w_$n.json "$@" > /tmp/r/w_$n.txt 2>&1; grep -v Warn /tmp/r/w_$n.txt | tail -14; }
W torch1; W lt1 --lt-rows 256; pack; echo "worker A/B after $(( $(date +%s) - T0 )) s"
S() { n=$1; shift; timeout 75 python3 -m bench.serve_bench --gpu --phases c64 --rounds 2 --out /tmp/r/$n "$@" > /tmp/r/$n.txt 2>&1
  kill_stack; rm -rf /tmp/r/$n/logs; grep -E "c64:" /tmp/r/$n.txt | cut -c1-160; grep -o '"decode_after_extend": [0-9]*' /tmp/r/$n.txt | tail -1
  python3 -m bench.forward_timeline /tmp/r/$n/forwards.tsv --json /tmp/r/fwd_$n.json > /tmp/r/fwd_$n.txt; grep -A8 "^segment 1" /tmp/r/fwd_$n.txt
  pack; echo "$n after $(( $(date +%s) - T0 )) s"; }
left 420 && S after1
left 460 && S sync1 --scheduler-flags=--no-chain-after-extend
left 480 && S after2
left 500 && S sync2 --scheduler-flags=--no-chain-after-extend
echo "done after $(( $(date +%s) - T0 )) s"
