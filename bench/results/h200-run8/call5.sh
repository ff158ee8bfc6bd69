#!/bin/bash
# H200 run 8, call 5 (issue 15 technique 2 and the profile its Done-when asks for): the worker bench with the GEMMs
# through torch's default BLAS choice, then cuBLASLt (--blas cublaslt), 1B and tiny shapes, B = 1, 64, 256, K = 8,
# context 1,152, back to back; then Nsight Compute on one decode-graph replay at B = 64 (1B) and B = 1 (tiny),
# each kernel node alone (--graph-profiling node): its time, DRAM and SM throughput, bytes read.
# Carry [".whl", ".jit"]; run: pip install ... && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MAX_JOBS=16;
#   bash bench/results/h200-run8/call5.sh > $OUT/log.txt 2>&1
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
B() { n=$1; shift; timeout 150 python3 -m worker_svc.bench --dtype bfloat16 --context 1152 --decode-steps 8 --batches 1,64,256 --prefill 1024 --json-out /tmp/r/w_$n.json "$@" 2>&1 | grep -v Warn | tail -14 > $OUT/w_$n.txt; }
B 1b_default --shape starcoderbase-1b
B 1b_lt --shape starcoderbase-1b --blas cublaslt
B tiny_default --shape tiny_starcoder_py
B tiny_lt --shape tiny_starcoder_py --blas cublaslt
echo "worker bench after $(( $(date +%s) - T0 )) s"
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,launch__grid_size,launch__block_size,sm__warps_active.avg.pct_of_peak_sustained_active
N() { n=$1; shift; timeout 200 ncu --profile-from-start off --graph-profiling node --metrics $M --csv --log-file /tmp/r/ncu_$n.csv \
      python3 -m worker_svc.bench --dtype bfloat16 --context 1152 --decode-steps 8 --prefill 16 --iters 2 --ncu "$@" > $OUT/ncu_$n.txt 2>&1; }
N 1b_b64 --shape starcoderbase-1b --batches 64
echo "ncu 1 after $(( $(date +%s) - T0 )) s"
N tiny_b1 --shape tiny_starcoder_py --batches 1
echo "ncu after $(( $(date +%s) - T0 )) s"
tar czf $OUT/json.tgz -C /tmp/r .
