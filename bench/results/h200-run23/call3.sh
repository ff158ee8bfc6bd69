#!/bin/bash
# Run 23 call 3 (carry [".whl", ".jit"]; prologue as call1.sh): the Triton decode attention alone at B = 64 (1B shape,
# context 1,152): attn_bench's sweep (contiguous and scattered slots), then Nsight Compute on the split-KV kernel and its
# merge (speed of light, memory workload, occupancy, warp states) to see why it reads KV at about half of HBM's rate.
mkdir -p /tmp/r
TS=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 200 python3 -m bench.attn_bench --shapes starcoderbase-1b --batches 64 --hbm-tbs 3.35 --out /tmp/r/attn > /tmp/r/attn.txt 2>&1
grep -E "B=" /tmp/r/attn.txt; pack; echo "attn_bench after $(( $(date +%s) - TS )) s"
timeout 240 ncu --graph-profiling node --kernel-name regex:mqa_decode --launch-skip 40 --launch-count 4 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats \
  --section SchedulerStats python3 -m bench.attn_bench --shapes starcoderbase-1b --batches 64 --layouts contiguous \
  --hbm-tbs 3.35 --out /tmp/r/attn_ncu > /tmp/r/ncu.txt 2>&1
grep -E "mqa_decode|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Shared Memory Config|Block Limit|Stall|Warp Cycles Per Issued|Grid Size|Block Size|L2 Hit|Eligible|Issued Warp" /tmp/r/ncu.txt | head -120
pack; echo "done after $(( $(date +%s) - TS )) s"
