#!/bin/bash
# H200 run 14 call 4 (after call 3 compiled flashinfer's fa2 prefill): (1) the whole extend graphs with the fa2
# paged prefill against eager (test_gpu_whole_graph.py -k fa2: 1 and 5 new tokens plan a smaller query tile than
# the capture's); (2) the worker bench's editor extend (tiny, 128 new tokens after a cached 1,700) with
# --extend-attention auto and fa2; (3) the editor (20 typists) with --worker-flags "--extend-attention fa2".
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
mkdir -p /tmp/r/c4
timeout 200 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu_whole_graph.py -k "fa2" 2>&1 | tail -6 | tee /tmp/r/c4/tests.txt
for ea in auto fa2; do
  timeout 100 python3 -m worker_svc.bench --shape tiny_starcoder_py --dtype bfloat16 --batches 1 --decode-steps 1 \
    --prefill 16,128,512 --prefill-prefix 1700 --extend-attention $ea --json-out /tmp/r/c4/w_ext_$ea.json 2>&1 | grep -v -i warn | grep "whole\|replay" | tee /tmp/r/c4/w_ext_$ea.txt
done
pack
python3 -m bench.editor_bench --gpu --out /tmp/r/c4/ed_fa2 --typists 20 --duration 15 --modes psm --context-files 4 \
  --worker-flags "--extend-attention fa2" --hop-trace /tmp/r/c4/hops > /tmp/r/c4/ed_fa2.txt 2>&1
rm -rf /tmp/r/c4/ed_fa2/logs; tar czf /tmp/r/c4/hops.tgz -C /tmp/r/c4 hops && rm -rf /tmp/r/c4/hops
python3 -c "
import json,glob; d=json.load(open(glob.glob('/tmp/r/c4/ed_fa2/*.json')[0])); print('fa2 TTFT', {k: round(v, 2) for k, v in d['ttft_ms'].items()}, 'answered', d['answered'])
for k, v in d['hops'].items(): print('   %-30s %.2f' % (k, v['p50_ms']))"
pack
echo "done after $(( $(date +%s) - T0 )) s"
