#!/bin/bash
# H200 run 22 call 4 (session 22; carry [".whl", ".jit"]): the Triton decode attention's splits for heads of 128
# (mqa_decode.decode_config: ceil(1.5 * sms / batch), new) against the rule before (mqa_decode_splits9.py swapped
# in: splits_for, 9 at B = 64); worker bench 1B B = 8 / 16 / 32 / 64, then serve_bench 1B c64 --rounds 2 alternated.
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
cp worker_svc/attention/mqa_decode.py /tmp/mqa_new.py
new() { cp /tmp/mqa_new.py worker_svc/attention/mqa_decode.py; }
old() { cp bench/results/h200-run22/mqa_decode_splits9.py worker_svc/attention/mqa_decode.py; }
A() { n=$1; timeout 60 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --context 1152 --decode-steps 8 \
  --batches 8,16,32,64 --prefill "" --json-out /tmp/r/a_$n.json > /tmp/r/a_$n.txt 2>&1; echo "$n:"; grep -E 'replay alone|K=8:' /tmp/r/a_$n.txt; }
new; A new1; old; A old1; new; A new2; old; A old2; new
pack; echo "worker A/B after $(( $(date +%s) - T0 )) s"
S() { n=$1; timeout 75 python3 -m bench.serve_bench --gpu --phases c64 --rounds 2 --out /tmp/r/$n > /tmp/r/$n.txt 2>&1
  kill_stack; rm -rf /tmp/r/$n/logs; grep -E "c64:" /tmp/r/$n.txt | cut -c1-160; pack; echo "$n after $(( $(date +%s) - T0 )) s"; }
left 300 && { new; S snew1; }
left 300 && { old; S sold1; }
left 350 && { new; S snew2; }
left 350 && { old; S sold2; }
new; echo "done after $(( $(date +%s) - T0 )) s"
