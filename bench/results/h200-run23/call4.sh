#!/bin/bash
# Run 23 call 4 (carry [".whl", ".jit"]; prologue as call1.sh): why the decode attention's split-KV kernel is latency-bound
# (call 3: 11.8% achieved occupancy, 0.15 eligible warps a scheduler, 41% of DRAM): its warps' stall reasons per issued
# instruction, DRAM bytes, and the instruction mix, at B = 64 (1B shape, context 1,152, the rule's configuration).
mkdir -p /tmp/r
TS=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
timeout 200 ncu --graph-profiling node --kernel-name regex:mqa_decode_part --launch-skip 40 --launch-count 1 \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,smsp__inst_executed_op_ldgsts.sum,smsp__inst_executed_op_global_ld.sum,gpu__time_duration.sum" \
  --section SourceCounters python3 -m bench.attn_bench --shapes starcoderbase-1b --batches 64 --layouts contiguous \
  --hbm-tbs 3.35 --out /tmp/r/attn_ncu > /tmp/r/ncu_stalls.txt 2>&1
grep -vE "^\s*$|==PROF==" /tmp/r/ncu_stalls.txt | grep -E "stalled|dram__|warps_active|inst_executed|l1tex|duration|Stall|Warp Stall|Location|Samples|mqa_decode" | \
  awk '{ if ($NF+0 > 0.05 || $0 !~ /stalled/) print }' | head -80
pack; echo "done after $(( $(date +%s) - TS )) s"
