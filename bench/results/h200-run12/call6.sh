#!/bin/bash
# H200 run 12, call 6 (on the warm machine after call 5): the editor (tiny, 20 typists, PSM, 15 s) hop by hop
# (--hop-trace): where a keystroke's TTFT goes after this session's changes. Carry [".whl", ".jit"].
mkdir -p /tmp/r2
ls /tmp/mtiny > /dev/null 2>&1 || python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
timeout 62 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm --duration 15 --typists 20 \
  --hop-trace /tmp/hops --out /tmp/ed_hops > /tmp/r2/editor_hops.txt 2>&1
pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"
cp /tmp/ed_hops/*.json /tmp/r2/ 2>/dev/null; tail -1 /tmp/r2/editor_hops.txt | cut -c1-300
tar czf $OUT/r2.tgz -C /tmp/r2 .
