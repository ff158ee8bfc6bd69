#!/bin/bash
# H200 run 22 call 2 (session 21; carry [".whl", ".jit"]; prologue as call 1's):
# (1) bench/l2_prefetch_bench.py (new): the decode step's projections with the next one's weights read into L2 on a
#     side stream of the same graph, against without (1B: M = 1, 64, 256; no attention stand-in and 37.7 MB of KV a
#     layer; tiny: M = 1, 64);
# (2) the targets with this session's code: serve_bench 1B c256 and c1 (call 1 measured c64).
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 150 python3 -m bench.l2_prefetch_bench --shape starcoderbase-1b --rows 64,1,256 --out /tmp/r/l2_1b > /tmp/r/l2_1b.txt 2>&1
cat /tmp/r/l2_1b.txt | grep -v Warn | tail -40; pack; echo "l2 1b after $(( $(date +%s) - T0 )) s"
timeout 60 python3 -m bench.l2_prefetch_bench --shape tiny_starcoder_py --rows 64,1 --kv-mb 0 --out /tmp/r/l2_tiny > /tmp/r/l2_tiny.txt 2>&1
cat /tmp/r/l2_tiny.txt | grep -v Warn | tail -14; pack; echo "l2 tiny after $(( $(date +%s) - T0 )) s"
timeout 200 python3 -m bench.serve_bench --gpu --phases c256,c1 --out /tmp/r/serve > /tmp/r/serve.txt 2>&1
kill_stack; rm -rf /tmp/r/serve/logs; grep -E "c256:|c1:" /tmp/r/serve.txt | cut -c1-300; tail -30 /tmp/r/serve.txt | grep -v "^\[" | head -30
pack; echo "done after $(( $(date +%s) - T0 )) s"
