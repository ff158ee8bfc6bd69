#!/bin/bash
# H200 run 20 call 1 (carry [".whl", ".jit"]; prologue: pip install --no-index --no-deps --target /tmp/site .whl/*.whl
# && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; bash bench/results/h200-run20/call1.sh):
# (1) serve_bench 1B c64 --rounds 2 with --hop-trace: where the device's idle time between two waves goes
#     (bench/wave_report.py: the worker's Forward timeline joined with every request's hops, the client's included);
# (2) the Triton MQA decode attention swept wide (bench/attn_bench.py --wide: split counts 3..18 at B = 64, more
#     tiles and pipeline depths) for the 1B at B = 64, contiguous slots.
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 200 python3 -m bench.serve_bench --gpu --phases c64 --rounds 2 --out /tmp/r/sb --hop-trace /tmp/r/hops > /tmp/r/sb.txt 2>&1
kill_stack; rm -rf /tmp/r/sb/logs; grep -E "c64:" /tmp/r/sb.txt | cut -c1-250
python3 -m bench.forward_timeline /tmp/r/sb/forwards.tsv > /tmp/r/fwd.txt; grep -A8 "^segment 1" /tmp/r/fwd.txt
python3 -m bench.wave_report /tmp/r/sb/forwards.tsv /tmp/r/hops > /tmp/r/waves.txt; head -80 /tmp/r/waves.txt
python3 -m bench.hop_report /tmp/r/hops --last client_done > /tmp/r/hops.txt; cat /tmp/r/hops.txt
tar czf /tmp/r/hops.tgz -C /tmp/r hops && rm -rf /tmp/r/hops
pack; echo "serve_bench after $(( $(date +%s) - T0 )) s"
timeout 240 python3 -m bench.attn_bench --shapes starcoderbase-1b --batches 64 --layouts contiguous --wide \
  --out /tmp/r/attn > /tmp/r/attn.txt 2>&1; tail -5 /tmp/r/attn.txt
python3 - <<'PY'
import json
d = json.load(open('/tmp/r/attn/attn_bench.json'))
for c in d['results']:
    ok = sorted((t for t in c['triton'] if 'us' in t), key=lambda t: t['us'])
    print(c['batch'], 'flashinfer', round(c['flashinfer_us'], 2), 'rule', [t for t in c['triton'] if 'us' in t][:0])
    for t in ok[:8]:
        print('   ', t['config'], round(t['us'], 2), round(t['tbs'], 2))
PY
pack; (cd ~ && tar czf /tmp/jit.tgz .cache/flashinfer .triton) && split -b 15000000 -d /tmp/jit.tgz $OUT/jit.part
echo "done after $(( $(date +%s) - T0 )) s"
