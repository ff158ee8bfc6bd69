#!/bin/bash
# H200 run 20 call 3 (carry [".whl", ".jit"]; prologue as call 1): (1) the Triton MQA decode attention swept wide
# (bench/attn_bench.py --wide: split counts 3..18 at B = 64, more tiles and pipeline depths), 1B, contiguous slots;
# (2) tests/worker/test_gpu.py with the time left.
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 200 python3 -m bench.attn_bench --shapes starcoderbase-1b --batches 64 --layouts contiguous --wide \
  --out /tmp/r/attn > /tmp/r/attn.txt 2>&1; tail -3 /tmp/r/attn.txt
python3 - <<'PY'
import json
d = json.load(open('/tmp/r/attn/attn_bench.json'))
for c in d['results']:
    ok = sorted((t for t in c['triton'] if 'us' in t), key=lambda t: t['us'])
    print(c['batch'], 'flashinfer', round(c['flashinfer_us'], 2), 'us; best Triton configurations:')
    for t in ok[:10]:
        print('   ', t['config'], round(t['us'], 2), 'us', round(t['tbs'], 2), 'TB/s')
PY
pack; echo "attn after $(( $(date +%s) - T0 )) s"
timeout $(( 570 - $(date +%s) + T0 )) python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py 2>&1 | tail -4 | tee /tmp/r/test_gpu.txt
pkill -9 -f pytest; pack
echo "done after $(( $(date +%s) - T0 )) s"
