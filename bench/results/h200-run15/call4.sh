#!/bin/bash
# H200 run 15 call 4 (issue 15): programmatic dependent launches on and off, alternated twice in one call, for the
# 1B and the tiny model's decode steps (worker_svc.bench, K = 8, context 1,152, B = 1, 64, 256): call 3 gave the 1B
# B = 64 replay 1.815 (PDL) / 1.792 ms (none) and the chained step 2.23 / 2.12 ms, one pair.
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
W() { shape=$1; pdl=$2; n=$3
  timeout 150 python3 -m worker_svc.bench --shape $shape --dtype bfloat16 --batches 1,64,256 --context 1152 \
    --decode-steps 8 --prefill 16 --no-whole-graph --$pdl --json-out /tmp/r/w_${shape}_${pdl}_$n.json > /tmp/r/w_${shape}_${pdl}_$n.txt 2>&1
  python3 - /tmp/r/w_${shape}_${pdl}_$n.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    if r["case"] in ("decode_multistep", "decode_chained") and r.get("prepare_ahead", True):
        print(f'  {d["model"]:32s} pdl={d["pdl"]!s:5s} B={r["batch"]:3d} {r["case"]:16s} step {r["step_ms"]:.3f} ms'
              + (f'  replay {r["graph_replay_ms"]:.3f}' if "graph_replay_ms" in r else ""))
PY
  echo "$shape $pdl $n after $(( $(date +%s) - T0 )) s"; pack; }
for n in 1 2; do
  W starcoderbase-1b pdl $n
  W starcoderbase-1b no-pdl $n
done
W tiny_starcoder_py pdl 1
W tiny_starcoder_py no-pdl 1
echo "done after $(( $(date +%s) - T0 )) s"
