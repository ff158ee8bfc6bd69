#!/bin/bash
# Run 27 call 3 (session 27; carry [".whl", ".jit", ".baseline"]): worker-bench A/Bs, 1B bf16, context 1,152, K = 8
# (GPU time of a step = graph replay alone; K=8 = Forwards one at a time; chained = launched behind):
# (1) this tree (the greedy pick inside the decode graphs, model/greedy.py; the new K/V written by the Triton
#     attention kernel, no write_kv kernel) against the worker of 4bbeb33 (.baseline,
#     laid over a copy of this tree in /tmp/base), B = 1 / 64 / 256, alternated twice; note the replay-alone figure
#     now holds the argmax and no float32 cast (before: the cast, and the argmax outside);
# (2) the Triton MQA attention for every decode bucket (--decode-attention triton: no host plan, launch behind) at
#     B = 64 / 256 (run 25: B = 256 K = 8 3.64 ms a step against 2.81 of GPU time, none launched behind);
# (3) the split-K GEMM for one MLP projection only at B = 64 (mlp.c_proj: cuBLAS runs 88 CTAs on 132 SMs; c_fc);
#     the decode attention with 8 warps; (4) a profile of the default at B = 256.
mkdir -p /tmp/r; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
rm -rf /tmp/base && mkdir /tmp/base && tar cf - --exclude=./.whl --exclude=./.jit --exclude=./.baseline --exclude=./bench/results . \
  | tar xf - -C /tmp/base && rm -f /tmp/base/worker_svc/model/greedy.py && cp -r .baseline/worker_svc/. /tmp/base/worker_svc/
NEW=$PWD
W() { n=$1; dir=$2; lim=$3; shift 3; ok $lim || return; (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 100 python3 -m worker_svc.bench \
  --shape starcoderbase-1b --dtype bfloat16 --decode-steps 8 --context 1152 --prefill "" --json-out /tmp/r/w_$n.json "$@" \
  > /tmp/r/w_$n.txt 2>&1); echo "$n:"; grep -E "K=8|replay alone|Error|error" /tmp/r/w_$n.txt | cut -c1-150; echo "  ($(( $(date +%s) - TS )) s)"; pack; }
W new1 $NEW 480 --batches 1,64,256
W base1 /tmp/base 480 --batches 1,64,256
W tri1 $NEW 480 --batches 64,256 --decode-attention triton
W new2 $NEW 480 --batches 1,64,256
W base2 /tmp/base 480 --batches 1,64,256
W skc $NEW 500 --batches 64 --cuda-graph-max-batch 64 --splitk-rows 64 --splitk-only mlp.c_proj
W skf $NEW 500 --batches 64 --cuda-graph-max-batch 64 --splitk-rows 64 --splitk-only c_fc
W w8 $NEW 520 --batches 64 --cuda-graph-max-batch 64 --attn-warps 8
W d64 $NEW 520 --batches 64 --cuda-graph-max-batch 64
W prof $NEW 540 --batches 256 --profile /tmp/r/prof
gzip /tmp/r/prof/*.json 2>/dev/null
pack; echo "done after $(( $(date +%s) - TS )) s"
