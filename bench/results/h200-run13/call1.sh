#!/bin/bash
# H200 run 13, call 1 (session 11): (1) the GPU tests not run since the ragged-prefill merge: test_gpu_whole_graph.py,
# test_gpu_fused.py, test_gpu_shapes.py (their first fresh extends take the ragged path now); this checkout has no
# JIT cache: the tests compile it (~280 s) and it goes back as $OUT/jit.part*; (2) the editor (tiny, 20 typists, PSM,
# 15 s) hop by hop with the worker's new forward_run hop (the Forward's wait for the Forwards ahead of it, split from
# its own run); (3) the Triton decode attention on the 15B shape against flashinfer (auto gives the 3B-15B shapes
# none: measured before extending build.triton_decode_max_batch); (4) first: the 1B's chained decode Forwards with
# the step metadata built while the Forward ahead runs (--prepare-ahead, new) against built at the launch (the
# worker bench alternates both). Carry [".whl"].
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
if [ -d .jit ]; then cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"; else NOJIT=1; fi
timeout 330 python3 -m pytest -o addopts="" -q -p no:warnings tests/worker/test_gpu_whole_graph.py tests/worker/test_gpu_fused.py \
  tests/worker/test_gpu_shapes.py tests/worker/test_gpu_ragged.py 2>&1 | tail -30 > /tmp/r/tests.txt
echo "tests after $(( $(date +%s) - T0 )) s"; cat /tmp/r/tests.txt; pack
[ -n "$NOJIT" ] && (cd ~ && tar czf /tmp/jit.tgz .cache/flashinfer .triton 2>/dev/null) && split -b 15000000 -d /tmp/jit.tgz $OUT/jit.part
W() { n=$1; shift; timeout $T python3 -m worker_svc.bench --dtype bfloat16 --context 1152 --decode-steps 8 --prefill 16 \
        --json-out /tmp/r/w_$n.json "$@" 2>&1 | grep -v -i warn | tail -25 > /tmp/r/w_$n.txt; grep -E "replay alone|K=8|chained" /tmp/r/w_$n.txt; pack; }
left 420 && T=130 W 1b_ahead --shape starcoderbase-1b --batches 1,64
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
left 480 && timeout 62 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm --duration 15 \
  --typists 20 --hop-trace /tmp/hops --out /tmp/ed_hops > /tmp/r/editor_hops.txt 2>&1
pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"
cp /tmp/ed_hops/*.json /tmp/r/ 2>/dev/null; tail -1 /tmp/r/editor_hops.txt | cut -c1-300; python3 -m bench.hop_report /tmp/hops; pack
left 500 && T=100 W 15b_fi --shape starcoder --batches 1,64 --decode-attention flashinfer
left 540 && T=100 W 15b_triton --shape starcoder --batches 1,64 --decode-attention triton
echo "done after $(( $(date +%s) - T0 )) s"
