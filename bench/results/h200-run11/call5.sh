#!/bin/bash
# H200 run 11, call 5: decode attention alone (bench/attn_bench.py, new): flashinfer's tensor-core decode against
# the Triton multi-query kernel (worker_svc/attention/mqa_decode.py, new; configurations swept), 24 distinct K/V
# pools per CUDA graph, context 1,152, bf16: 1B and tiny at B = 1, 64, 256, contiguous and scattered slots; then
# the 15B shape at B = 64, 256 with the time left. Carry [".whl", ".jit"]; results packed into $OUT/json.tgz.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
timeout 250 python3 -m bench.attn_bench --shapes starcoderbase-1b,tiny_starcoder_py --batches 1,64,256 --out /tmp/r/a 2>&1 | grep -v Warn > /tmp/r/attn.txt
cat /tmp/r/attn.txt | tail -20; pack; echo "attn after $(( $(date +%s) - T0 )) s"
[ $(( $(date +%s) - T0 )) -lt 300 ] && timeout $(( 380 - ($(date +%s) - T0) )) python3 -m bench.attn_bench --shapes starcoder --batches 64,256 --layouts contiguous --out /tmp/r/a15 2>&1 | grep -v Warn > /tmp/r/attn15.txt
cat /tmp/r/attn15.txt | tail -5; pack; echo "done after $(( $(date +%s) - T0 )) s"
