#!/bin/bash
# H200 run 10, call 5: launch ahead, second form (call 4's launched N+1 as soon as N's steps were enqueued and lost
# end to end: an extend inserted ahead of N+1 could no longer run before it). N+1 now launches once the device
# reached N's last step. GPU test of launch ahead on the graphs, worker_svc.bench chained on/off (1B), serve_bench
# c64,c1 default vs --no-launch-ahead alternated twice, then the editor (tiny, 20 typists) once each if time is left.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
python3 -m worker_svc.model.default --shape starcoderbase-1b --dtype bfloat16 --device cuda --out /tmp/codeserve-bench-model > /dev/null &
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null &
timeout 120 python3 -m pytest -o addopts="" -q -p no:warnings tests/worker/test_gpu.py -k "launched_ahead or multistep" 2>&1 | tail -5 > /tmp/r/tests.txt
wait
cat /tmp/r/tests.txt
timeout 120 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --context 1152 --decode-steps 8 --batches 1,64,256 --prefill 16 --iters 6 --json-out /tmp/r/w_1b.json 2>&1 | grep -v Warn | tail -16 > /tmp/r/w_1b.txt
tar czf $OUT/json.tgz -C /tmp/r .; echo "worker bench after $(( $(date +%s) - T0 )) s"
S() { timeout 100 python3 -m bench.serve_bench --gpu --out /tmp/sb_$1 --phases c64,c1 --worker-flags="$2" > /tmp/r/serve_$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; cp /tmp/sb_$1/serve_bench.json /tmp/r/serve_$1.json; tar czf $OUT/json.tgz -C /tmp/r .; }
S on1 ""; S off1 "--no-launch-ahead"; S on2 ""; S off2 "--no-launch-ahead"
echo "serve after $(( $(date +%s) - T0 )) s"
E() { timeout 50 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm --duration 15 --typists 20 --worker-flags="$2" --out /tmp/ed_$1 > /tmp/r/editor_$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; mkdir -p /tmp/r/ed_$1; cp /tmp/ed_$1/editor_*.json /tmp/r/ed_$1/; tar czf $OUT/json.tgz -C /tmp/r .; }
[ $(( $(date +%s) - T0 )) -lt 300 ] && E on1 "" && E off1 "--no-launch-ahead"
echo "editor after $(( $(date +%s) - T0 )) s"
