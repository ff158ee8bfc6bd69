#!/bin/bash
# Session 30 call 1, carry [".whl", ".jit2", ".baseline"] (.baseline: scheduler_svc and worker_svc of a14abbf, the
# session's start, without the model assets; prologue: pip install of .whl into /tmp/site, PYTHONPATH=/tmp/site:$PWD, the .jit2 cache
# untar'd into ~). In priority order, each step guarded by the time left of the call's 600 s:
# (1) the GPU tests (test_gpu.py whole, extend_behind, fused, plan_ring); (2) every default against issue 15's targets
# (serve_bench hf,c64,c256,c1 with transformers' compiled static generate; worker bench 1B and tiny); (3) the A/B of this
# session's scheduler and worker (decode chained past the extends; continuations at their turn in two parts) against a14abbf's, c64 + c256, alternated; (4) c64
# with every request's hops traced (the wave boundary and the tail); (5) the B = 64 decode step's kernels.
mkdir -p /tmp/r; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 200 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py tests/worker/test_gpu_extend_behind.py tests/worker/test_gpu_fused.py tests/worker/test_plan_ring.py \
  > /tmp/r/tests.txt 2>&1; tail -3 /tmp/r/tests.txt
pack; echo "tests after $(( $(date +%s) - TS )) s"
ok 330 && timeout 150 python3 -m bench.serve_bench --gpu --phases hf,c64,c256,c1 --c1-requests 5 --hf-baselines static_compiled \
  --out /tmp/r/serve > /tmp/r/serve.txt 2>&1
kill_stack; rm -rf /tmp/r/serve/logs; grep -E "c64:|c256:|c1:|static_compiled:" /tmp/r/serve.txt | cut -c1-240
pack; echo "serve after $(( $(date +%s) - TS )) s"
W() { n=$1; shift; ok $1 || return; shift; timeout 70 python3 -m worker_svc.bench --dtype bfloat16 --decode-steps 8 \
  --json-out /tmp/r/w_$n.json "$@" > /tmp/r/w_$n.txt 2>&1; echo "$n:"; grep -E "replay alone|prefill" /tmp/r/w_$n.txt | cut -c1-200; }
W 1b 420 --shape starcoderbase-1b --context 1152 --batches 1,64,256 --prefill 1024,8192
W tiny 460 --shape tiny_starcoder_py --context 1152 --batches 1,64 --prefill 1024
pack; echo "worker after $(( $(date +%s) - TS )) s"
rm -rf /tmp/base && mkdir /tmp/base && tar cf - --exclude=./.whl --exclude=./.jit2 --exclude=./.baseline --exclude=./bench/results . \
  | tar xf - -C /tmp/base && rm -rf /tmp/base/scheduler_svc && cp -r .baseline/scheduler_svc /tmp/base/ && cp -r .baseline/worker_svc/. /tmp/base/worker_svc/
AB() { name=$1; dir=$2; ok $3 || return; (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 60 python3 -m bench.serve_bench --gpu --phases c64,c256 \
  --out /tmp/r/$name > /tmp/r/$name.txt 2>&1); kill_stack; rm -rf /tmp/r/$name/logs; echo "== $name"; grep -E "c64:|c256:" /tmp/r/$name.txt | cut -c24-200
  python3 -m bench.forward_timeline /tmp/r/$name/forwards.tsv 2>&1 | grep -E "^segment [12]|gap extend->decode" | head -6; pack; }
AB new1 $PWD 480; AB base1 /tmp/base 520
ok 545 && { timeout 50 python3 -m bench.serve_bench --gpu --phases c64 --out /tmp/r/hop --hop-trace /tmp/r/hops > /tmp/r/hop.txt 2>&1
  kill_stack; rm -rf /tmp/r/hop/logs; grep -E "c64:" /tmp/r/hop.txt | cut -c1-200
  python3 -m bench.wave_report /tmp/r/hop/forwards.tsv /tmp/r/hops --min-gap-ms 5 > /tmp/r/waves.txt 2>&1
  python3 -m bench.hop_report /tmp/r/hops --last client_done > /tmp/r/hops.txt 2>&1
  tar czf /tmp/r/hops.tgz -C /tmp/r hops && rm -rf /tmp/r/hops; pack; echo "hops after $(( $(date +%s) - TS )) s"; }
echo "done after $(( $(date +%s) - TS )) s"
