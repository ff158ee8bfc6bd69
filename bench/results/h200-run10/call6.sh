#!/bin/bash
# H200 run 10, call 6 (the last of this session's device time): launch ahead, third form: the table lock is given
# back before the launched Forward's steps are enqueued (call 5: enqueuing K steps held it ~K - 1 steps of device
# time, so the Forward ahead committed and replied ~a Forward late). GPU test, then serve_bench c64,c1 on / off.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
python3 -m worker_svc.model.default --shape starcoderbase-1b --dtype bfloat16 --device cuda --out /tmp/codeserve-bench-model > /dev/null &
timeout 60 python3 -m pytest -o addopts="" -q -p no:warnings tests/worker/test_gpu.py -k "launched_ahead" 2>&1 | tail -3 > /tmp/r/tests.txt
wait; cat /tmp/r/tests.txt; tar czf $OUT/json.tgz -C /tmp/r .
S() { timeout 60 python3 -m bench.serve_bench --gpu --out /tmp/sb_$1 --phases c64,c1 --worker-flags="$2" > /tmp/r/serve_$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; cp /tmp/sb_$1/serve_bench.json /tmp/r/serve_$1.json; tar czf $OUT/json.tgz -C /tmp/r .; }
S on1 ""; S off1 "--no-launch-ahead"
echo "serve after $(( $(date +%s) - T0 )) s"
