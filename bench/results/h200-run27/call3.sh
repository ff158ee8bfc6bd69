#!/bin/bash
# Run 27 call 3 (session 27; carry [".whl", ".jit"]): worker-bench A/Bs, 1B bf16, context 1,152, K = 8, GPU time and
# host-bound step times: (1) the Triton MQA attention for every decode bucket (--decode-attention triton: no host
# plan, no per-step wait for flashinfer's plan buffer) against the default (flashinfer above 64 rows), B = 64 / 256,
# alternated twice (run 25: B = 256 K = 8 3.64 ms a step against 2.81 of GPU time, none launched behind); (2) the
# split-K GEMM for one MLP projection only at B = 64 (mlp.c_proj: cuBLAS runs 88 CTAs on 132 SMs; c_fc); (3) a
# profile of the default at B = 256 (host ops of one Forward).
mkdir -p /tmp/r; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
W() { n=$1; shift; ok $1 || return; shift; timeout 100 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 \
  --decode-steps 8 --context 1152 --prefill "" --json-out /tmp/r/w_$n.json "$@" > /tmp/r/w_$n.txt 2>&1; echo "$n:";
  grep -E "K=8|replay alone" /tmp/r/w_$n.txt | cut -c1-150; echo "  ($(( $(date +%s) - TS )) s)"; pack; }
W def1 400 --batches 64,256
W tri1 400 --batches 64,256 --decode-attention triton
W def2 400 --batches 64,256
W tri2 400 --batches 64,256 --decode-attention triton
W skc 470 --batches 64 --cuda-graph-max-batch 64 --splitk-rows 64 --splitk-only mlp.c_proj
W skf 470 --batches 64 --cuda-graph-max-batch 64 --splitk-rows 64 --splitk-only c_fc
W d64 470 --batches 64 --cuda-graph-max-batch 64
W prof 530 --batches 256 --profile /tmp/r/prof
ls /tmp/r/prof 2>/dev/null; gzip /tmp/r/prof/*.json 2>/dev/null
pack; echo "done after $(( $(date +%s) - TS )) s"
