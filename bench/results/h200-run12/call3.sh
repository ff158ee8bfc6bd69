#!/bin/bash
# H200 run 12, call 3: (1) the host gap of a multi-step Forward: torch.profiler chrome traces of one K = 8 Forward,
# tiny B = 1 and 1B B = 64 (the worker's K = 8 step is 0.84 / 2.18 ms against 0.71 / 1.85 of graph replay, call 1),
# kept gzipped; (2) the issue-15 targets not measured since run 5 / run 11: one 1,024-token prefill with no cached
# prefix (tiny, 1B: eager / piecewise / whole graph), the 1B's 8,192-token prefill, and the 15B shape's decode
# steps at B = 1 / 64 / 256 and its 1,024-token prefill. Carry [".whl", ".jit"]. Results in $OUT/json.tgz.
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
W() { n=$1; t=$2; shift 2; timeout $t python3 -m worker_svc.bench --dtype bfloat16 --context 1152 --decode-steps 8 \
        --json-out /tmp/r/w_$n.json "$@" 2>&1 | grep -v -i warn | tail -16 > /tmp/r/w_$n.txt; cat /tmp/r/w_$n.txt; pack; }
W tiny_b1_prof 80 --shape tiny_starcoder_py --batches 1 --prefill 16 --profile /tmp/r/prof_tiny
W 1b_b64_prof 80 --shape starcoderbase-1b --batches 64 --prefill 16 --profile /tmp/r/prof_1b
gzip -f /tmp/r/prof_*/trace-*.json; pack
W tiny_prefill 80 --shape tiny_starcoder_py --batches 1 --prefill 1024,2048
W 1b_prefill 100 --shape starcoderbase-1b --batches 1 --prefill 1024,2048,8192 --extend-graph-max-tokens 1024
echo "after $(( $(date +%s) - T0 )) s"
W 15b 200 --shape starcoder --batches 1,64,256 --prefill 1024
echo "done after $(( $(date +%s) - T0 )) s"
