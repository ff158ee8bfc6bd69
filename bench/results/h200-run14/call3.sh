#!/bin/bash
# H200 run 14 call 3: (1) the editor (call2.sh) with py-spy --gil: the Python work of each service process under
# the editor load, CPython's default switch interval (5 ms); (2) the same with CODESERVE_SWITCH_INTERVAL_US=250
# and =100 (common/switch_interval.py: a thread woken on a request's path waits for the GIL about that long);
# (3) bench.extend_attn_bench: flashinfer's paged prefill fa3 (today's) against fa2 (split KV in graph mode) for
# one extend over a cached prefix (compiles the fa2 modules: the JIT cache goes back as $OUT/jit.part*).
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
mkdir -p /tmp/r
TAG=ed_5ms bash bench/results/h200-run14/call2.sh 2>&1 | tail -20; pack
CODESERVE_SWITCH_INTERVAL_US=250 TAG=ed_250us bash bench/results/h200-run14/call2.sh 2>&1 | tail -20; pack
CODESERVE_SWITCH_INTERVAL_US=100 TAG=ed_100us bash bench/results/h200-run14/call2.sh 2>&1 | tail -20; pack
echo "editor done after $(( $(date +%s) - T0 )) s"
timeout 330 python3 -m bench.extend_attn_bench --shapes tiny_starcoder_py,starcoderbase-1b,starcoder --new 16,128,512,1024 \
  --prefix 1700,0 --out /tmp/r/eab 2>&1 | grep -v -i warn | tail -30 | tee /tmp/r/eab.txt
(cd ~ && tar czf /tmp/jit.tgz .cache/flashinfer .triton 2>/dev/null) && split -b 15000000 -d /tmp/jit.tgz $OUT/jit.part
pack
echo "done after $(( $(date +%s) - T0 )) s"
