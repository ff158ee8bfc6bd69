#!/bin/bash
# Run 27 call 7 (session 27; carry [".whl", ".jit", ".baseline"]; ~450 s, what the device budget left allows), any
# card: (1) the GPU tests of this session's changes: test_gpu.py's graph and multi-step cases (graph == eager through
# the greedy pick and the K/V write in the attention), test_gpu_extend_behind.py (the continuations), the greedy pick
# against torch.argmax; (2) the worker bench of this tree against 4bbeb33's worker (.baseline) at B = 1 / 64 / 256,
# K = 8; (3) serve_bench c64,c256 on this tree (the Forward timeline's extend -> extend gaps).
mkdir -p /tmp/r; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 110 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py -k "graph or multistep or mqa" \
  > /tmp/r/tests.txt 2>&1; tail -4 /tmp/r/tests.txt
timeout 80 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu_extend_behind.py \
  \
  "tests/worker/test_gpu_fused.py::test_served_model_with_fused_kernels_decodes_as_without" > /tmp/r/tests2.txt 2>&1
tail -4 /tmp/r/tests2.txt; pack; echo "tests after $(( $(date +%s) - TS )) s"
rm -rf /tmp/base && mkdir /tmp/base && tar cf - --exclude=./.whl --exclude=./.jit --exclude=./.baseline --exclude=./bench/results . \
  | tar xf - -C /tmp/base && rm -f /tmp/base/worker_svc/model/greedy.py && cp -r .baseline/worker_svc/. /tmp/base/worker_svc/
NEW=$PWD
W() { n=$1; dir=$2; lim=$3; shift 3; ok $lim || return; (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 80 python3 -m worker_svc.bench \
  --shape starcoderbase-1b --dtype bfloat16 --decode-steps 8 --context 1152 --prefill "" --json-out /tmp/r/w_$n.json "$@" \
  > /tmp/r/w_$n.txt 2>&1); echo "$n:"; grep -E "K=8|replay alone|Error|error" /tmp/r/w_$n.txt | cut -c1-150; echo "  ($(( $(date +%s) - TS )) s)"; pack; }
W new1 $NEW 260 --batches 1,64,256
W base1 /tmp/base 330 --batches 1,64,256
ok 360 && (timeout 85 python3 -m bench.serve_bench --gpu --phases c64,c256 --out /tmp/r/serve > /tmp/r/serve.txt 2>&1; kill_stack
  rm -rf /tmp/r/serve/logs; grep -E "c64:|c256:" /tmp/r/serve.txt | cut -c1-200
  python3 -m bench.forward_timeline /tmp/r/serve/forwards.tsv 2>&1 | grep -E "segment|gap" | head -12)
pack; echo "done after $(( $(date +%s) - TS )) s"
