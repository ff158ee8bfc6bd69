#!/bin/bash
# H200 run 12, call 2 (profile): call 1's worker bench showed the Triton decode attention taking 0.14 ms off tiny's
# B = 64 step (1.04 -> 0.90 ms of graph replay) but nothing off the 1B's (1.85 both), though attn_bench gives the 1B
# 22.6 -> 18.0 us a layer. Where the 1B's step goes with each: torch.profiler op tables of one K = 8 Forward at
# B = 64 (and 256), flashinfer and triton. Carry [".whl", ".jit"]. Results in $OUT/json.tgz.
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
P() { n=$1; shift; timeout 100 python3 -m worker_svc.bench --dtype bfloat16 --context 1152 --decode-steps 8 --prefill 16 \
        --profile /tmp/r/p_$n --json-out /tmp/r/p_$n.json "$@" 2>&1 | grep -v Warn | tail -8 > /tmp/r/p_$n.txt; cat /tmp/r/p_$n.txt
      rm -f /tmp/r/p_$n/trace-*.json; pack; }
for a in flashinfer triton; do
  P 1b64_$a --shape starcoderbase-1b --batches 64 --decode-attention $a
  P 1b256_$a --shape starcoderbase-1b --batches 256 --decode-attention $a
done
for a in flashinfer triton; do P tiny64_$a --shape tiny_starcoder_py --batches 64 --decode-attention $a; done
for f in /tmp/r/p_1b64_*/ops-b64.txt; do echo "== $f"; tail -32 $f | cut -c1-50,118-220; done
echo "done after $(( $(date +%s) - T0 )) s"
