#!/bin/bash
# H200 run 13, call 2: the worker's new --prepare-ahead end to end, A/B in one call. (1) the editor (tiny, 20
# typists, PSM, 15 s, hop trace) with it and without it (call 1's editor ran behind a pytest killed by its timeout,
# whose processes were still running: 41.8 ms); (2) serve_bench 1B hf,c64,c1 with transformers' compiled static
# generate as the baseline; (3) a torch.profiler trace of one 1B K = 8 Forward at B = 64 (where the 1.0 ms a step over
# the GPU time goes now). Carry [".whl", ".jit"].
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
E() { n=$1; shift; timeout 62 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm \
        --duration 15 --typists 20 --hop-trace /tmp/hops_$n --out /tmp/ed_$n "$@" > /tmp/r/editor_$n.txt 2>&1; kill_stack
      mkdir -p /tmp/r/ed_$n; cp /tmp/ed_$n/*.json /tmp/r/ed_$n/ 2>/dev/null; python3 -m bench.hop_report /tmp/hops_$n > /tmp/r/ed_$n/hops.txt
      tail -1 /tmp/r/editor_$n.txt | cut -c1-260; grep -E "forward|total" /tmp/r/ed_$n/hops.txt; echo "editor $n after $(( $(date +%s) - T0 )) s"; pack; }
E ahead
E atlaunch --worker-flags=--no-prepare-ahead
S() { n=$1; t=$2; shift 2; timeout $t python3 -m bench.serve_bench --gpu --out /tmp/sb_$n "$@" > /tmp/r/serve_$n.txt 2>&1; kill_stack
      cp /tmp/sb_$n/serve_bench.json /tmp/r/serve_$n.json 2>/dev/null; grep -iE "^phase|c64|c1 |tok/s|ttft" /tmp/r/serve_$n.txt | head -12
      echo "serve $n after $(( $(date +%s) - T0 )) s"; pack; }
left 250 && S ahead 170 --phases hf,c64,c1 --hf-baselines static_compiled
left 440 && timeout 100 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --context 1152 --decode-steps 8 \
  --batches 64 --prefill 16 --profile /tmp/r/prof_1b --json-out /tmp/r/w_1b_prof.json 2>&1 | grep -v -i warn | tail -12 > /tmp/r/w_1b_prof.txt
gzip -f /tmp/r/prof_1b/*.json 2>/dev/null; grep -E "K=8|replay alone" /tmp/r/w_1b_prof.txt; pack
echo "done after $(( $(date +%s) - T0 )) s"
