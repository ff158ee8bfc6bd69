#!/bin/bash
# Session 32 call 3 (inline on the warm H100 after call1; carry [".whl"], the JIT cache already on the machine):
# the looping grid at B = 1 (--resident-stream 0 against 2, alternated 3x) and the resident GEMM on tiny at 8-64
# rows with CTAs of 4 warps x 16 columns and 8 x 32. Output in call3/.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; mkdir -p /tmp/r4
W() { n=$1; shift; timeout 40 python3 -m worker_svc.bench --dtype bfloat16 --decode-steps 8 --context 1152 --prefill "" --json-out /tmp/r4/w_$n.json "$@" > /tmp/r4/w_$n.txt 2>&1; echo "$n: $(grep -E "replay alone" /tmp/r4/w_$n.txt | awk '{print $(NF-8)}' | tr '\n' ' ') $SECONDS"; }
for i in 1 2 3; do W st0_$i --shape starcoderbase-1b --batches 1 --resident-stream 0; W st2_$i --shape starcoderbase-1b --batches 1 --resident-stream 2; done
W tiny0 --shape tiny_starcoder_py --batches 8,16,32,64
W tiny4x16 --shape tiny_starcoder_py --batches 8,16,32,64 --resident-mm-rows 64 --resident-mm-shape 4x16
W tiny8x32 --shape tiny_starcoder_py --batches 8,16,32,64 --resident-mm-rows 64 --resident-mm-shape 8x32
tar czf $OUT/r4.tgz -C /tmp/r4 .
