#!/bin/bash
# (Session 33, call 3: run as written, unchanged, on the same warm H100 after call1.sh and call2.sh; copied from h200-run32/call6.sh.)
# Written in session 32 for the next session (after call5.sh, on the same warm machine; carry [".whl"] or with the JIT
# cache call5 returned). The A/B of --launch-lead-steps 0 (auto, new: 2 steps ahead for Forwards of more than 64 rows,
# 1 at or below; worker_svc/multistep.py lead_steps) against 1 (the default), c64 and c256, alternated twice; the
# decode -> decode gaps of each arm from its Forward timeline. First, tiny's resident GEMM up to 32 rows (the default)
# against 64 and off (worker bench, alternated), and where the resident GEMM's time goes on the 1B
# (bench/resident_gemm_bench.py: one split against several, one wave against two, behind a PDL add + LayerNorm, against
# cuBLAS). The third arm: the Triton decode attention in every bucket of the 1B (--decode-attention triton; auto takes
# it up to 64 rows): no flashinfer plan on the host per step, so a 256-row Forward's launch (5.2-5.8 ms p50 at c256 in
# run 32, H100) is shorter and more of them may be launched behind before the Forward ahead commits (4 of 34 were);
# run 12 had its B = 256 step at 2.89 ms of GPU time against flashinfer's 2.82; the worker bench at 128 / 256 rows
# first (GPU time, and the chained step launched behind / at its turn, which counts the host's launch). Prologue as
# call5.sh.
mkdir -p /tmp/r6; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
W() { n=$1; shift; timeout 60 python3 -m worker_svc.bench --dtype bfloat16 --decode-steps 8 --context 1152 --prefill "" \
  --json-out /tmp/r6/w_$n.json "$@" > /tmp/r6/w_$n.txt 2>&1; echo "$n: $(grep -E "replay alone" /tmp/r6/w_$n.txt | awk '{print $(NF-8)}' | tr '\n' ' ')"; }
W tiny_mm32 --shape tiny_starcoder_py --batches 8,32,64; W tiny_mm64 --shape tiny_starcoder_py --batches 8,32,64 --resident-mm-rows 64
W tiny_mm0 --shape tiny_starcoder_py --batches 8,32,64 --resident-mm-rows 0
W 1b_fi --shape starcoderbase-1b --batches 128,256; W 1b_tr --shape starcoderbase-1b --batches 128,256 --decode-attention triton
grep -h "chained\|replay alone" /tmp/r6/w_1b_fi.txt /tmp/r6/w_1b_tr.txt | cut -c1-120
timeout 90 python3 -m bench.resident_gemm_bench --shape starcoderbase-1b --rows 16,64 \
  --specs 8x32x1024,8x16x2048,4x32x512 --out /tmp/r6/rmm > /tmp/r6/rmm.txt 2>&1; cat /tmp/r6/rmm.txt
arm() { name=$1; shift
  timeout 130 python3 -m bench.serve_bench --gpu --phases c64,c256 --out /tmp/r6/$name --worker-flags="$*" > /tmp/r6/$name.txt 2>&1
  pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
  echo "== $name ($*)"; grep -E "c64:|c256:" /tmp/r6/$name.txt | cut -c24-220
  python3 -m bench.forward_timeline /tmp/r6/$name/forwards.tsv 2>&1 | grep -E "segment|gap decode->decode|stages decode" | tail -6
  rm -rf /tmp/r6/$name/logs; tar czf $OUT/r6.tgz -C /tmp/r6 .; }
arm base1 --launch-lead-steps 1
arm auto1 --launch-lead-steps 0
arm triton1 --decode-attention triton
arm base2 --launch-lead-steps 1
arm triton2 --decode-attention triton
