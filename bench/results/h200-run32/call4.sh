#!/bin/bash
# Session 32 call 4 (inline, warm H100): the resident GEMM on the 1B at 2-16 rows (cuBLAS above the 1-row GEMV
# today), CTAs of 8 warps x 64 and 8 x 32 columns, between two baselines. Output in call4/.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; mkdir -p /tmp/r5
W() { n=$1; shift; timeout 40 python3 -m worker_svc.bench --dtype bfloat16 --decode-steps 8 --context 1152 --prefill "" --json-out /tmp/r5/w_$n.json "$@" > /tmp/r5/w_$n.txt 2>&1; echo "$n: $(grep -E "replay alone" /tmp/r5/w_$n.txt | awk '{print $(NF-8)}' | tr '\n' ' ') $SECONDS"; }
W 1b_mm0 --shape starcoderbase-1b --batches 2,4,8,16; W 1b_8x64 --shape starcoderbase-1b --batches 2,4,8,16 --resident-mm-rows 64
W 1b_8x32 --shape starcoderbase-1b --batches 2,4,8,16 --resident-mm-rows 64 --resident-mm-shape 8x32; W 1b_mm0b --shape starcoderbase-1b --batches 2,4,8,16
tar czf $OUT/r5.tgz -C /tmp/r5 .
