#!/bin/bash
# H200 run 11, call 3: end to end (1B, serve_bench c64,c256,c1) with the two off-by-default worker switches:
# default / --extend-whole-graph / --extend-whole-graph --launch-ahead, alternated twice; then transformers'
# compiled static generate (the hf phase) with the time left. Carry [".whl", ".jit"].
set -x
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
S() { timeout 75 python3 -m bench.serve_bench --gpu --out /tmp/sb_$1 --phases ${3:-c64,c256,c1} --worker-flags="$2" > /tmp/r/serve_$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; cp /tmp/sb_$1/serve_bench.json /tmp/r/serve_$1.json; pack
      grep -A4 "^phase" /tmp/r/serve_$1.txt; echo "serve $1 after $(( $(date +%s) - T0 )) s"; }
for i in 1 2; do
  left 400 && S default$i ""
  left 430 && S whole$i "--extend-whole-graph"
  left 460 && S wla$i "--extend-whole-graph --launch-ahead"
done
left 380 && S hf "--extend-whole-graph" hf,c64
echo "done after $(( $(date +%s) - T0 )) s"
