#!/bin/bash
# Run 25 call 2 (session 25; carry [".whl", ".jit"]). Prologue:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null;
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MAX_JOBS=16; bash bench/results/h200-run25/call2.sh > $OUT/log.txt 2>&1
# Decode and prefill on two CUDA streams at once (worker_svc/bench_overlap.py, `worker_svc.bench --overlap-prefill`):
# the 1B's B = 64 decode graph (8 / 24 / 48 replays) beside one 8,192-token prefill (8 prompts of 1,024) captured as a
# graph, one after the other against two streams (equal priority; decode at high priority). Then the tiny model.
# At the end the JIT caches (flashinfer + Triton, with this code's kernels) come back as jit.part*.
mkdir -p /tmp/r
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name --format=csv,noheader
O() { n=$1; shift; ok $1 || return; shift; timeout 150 python3 -m worker_svc.bench --dtype bfloat16 --context 1152 \
  --decode-steps 8 --prefill "" --batches 64 --cuda-graph-max-batch 64 --iters 4 --overlap-prefill 8192 --json-out /tmp/r/o_$n.json "$@" \
  > /tmp/r/o_$n.txt 2>&1; echo "$n (rc $?):"; grep -E "replay alone|overlap:" /tmp/r/o_$n.txt; pack; }
O 1b 10 --shape starcoderbase-1b
O 1b_2k 150 --shape starcoderbase-1b --overlap-prefill 2048 --overlap-decode-replays 2,8
O tiny 230 --shape tiny_starcoder_py
(cd ~ && tar czf /tmp/jit.tgz .cache/flashinfer .triton) && split -b 15000000 -d /tmp/jit.tgz $OUT/jit.part
echo "done after $(( $(date +%s) - TS )) s"
