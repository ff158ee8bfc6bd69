#!/bin/bash
# Run 24 call 1 (written as run 23 call 4; carry [".whl", ".jit"]; prologue as call1.sh). (1) Why the decode attention's split-KV kernel is
# latency-bound (call 3: 11.8% achieved occupancy, 0.15 eligible warps a scheduler, 41% of DRAM): its warps' stall
# reasons per issued instruction at B = 64 (1B shape, context 1,152); (2) the kernel alone with V loaded beside K
# (attn_bench --early-v, --merge-rows) against call 3's sweep; (3) in the decode graphs, worker bench 1B B = 16 / 32 / 64:
# the default, --attn-early-v, --attn-warps 8, --attn-merge-rows (alone and with 8 splits: a cheaper merge may let
# more splits pay), the default again; (0) first the GPU tests of the new variants (test_gpu.py -k mqa).
mkdir -p /tmp/r
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name --format=csv,noheader
A() { n=$1; shift; ok 300 || return; timeout 50 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --context 1152 \
  --decode-steps 8 --prefill "" --batches 16,32,64 --json-out /tmp/r/a_$n.json "$@" > /tmp/r/a_$n.txt 2>&1; echo "$n:"
  grep -E 'replay alone' /tmp/r/a_$n.txt; }
timeout 120 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py -k mqa > /tmp/r/tests.txt 2>&1
tail -3 /tmp/r/tests.txt; pkill -9 -f pytest
A default1; A early_v --attn-early-v; A merge_rows --attn-merge-rows
A merge_rows_s8 --attn-merge-rows --attn-splits 8; A ev_mr --attn-early-v --attn-merge-rows
A ev_mr_s8 --attn-early-v --attn-merge-rows --attn-splits 8; A ev_mr_s18 --attn-early-v --attn-merge-rows --attn-splits 18
A pf --attn-prefetch; A pf_st1 --attn-prefetch --attn-stages 1; A pf_mr_s8 --attn-prefetch --attn-merge-rows --attn-splits 8
A default2
pack; echo "in-graph after $(( $(date +%s) - TS )) s"
for v in prefetch; do ok 330 && timeout 60 python3 -m bench.attn_bench --shapes starcoderbase-1b --batches 64 \
  --layouts contiguous --hbm-tbs 3.35 --$v --out /tmp/r/attn_$v > /tmp/r/attn_$v.txt 2>&1; grep -E "B=" /tmp/r/attn_$v.txt; done
ok 360 && timeout 60 ncu --graph-profiling node --kernel-name regex:mqa_decode_part --launch-skip 40 --launch-count 1 \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_op_ldgsts.sum,smsp__inst_executed_op_global_ld.sum,gpu__time_duration.sum" \
  python3 -m bench.attn_bench --shapes starcoderbase-1b --batches 64 --layouts contiguous --hbm-tbs 3.35 \
  --out /tmp/r/attn_ncu > /tmp/r/ncu_stalls.txt 2>&1
grep -E "stalled|dram__|warps_active|inst_executed|duration" /tmp/r/ncu_stalls.txt | awk '{ if ($NF+0 > 0.1 || $0 !~ /stalled/) print }' | head -40
pack; echo "done after $(( $(date +%s) - TS )) s"
