#!/bin/bash
# Run 28 call 2 (session 28; carry [".whl", ".jit", ".baseline"]; run after call8, on the same machine when it is warm):
# this tree (the flashinfer buckets launched behind through the plan ring; with gpu_untested.patch applied when call8
# passed: the greedy pick in the decode graphs, the K/V write in the Triton attention) against the worker of 4bbeb33
# (.baseline = `git archive 4bbeb33 worker_svc` without the model assets, laid over a copy of this tree in /tmp/base):
# serve_bench c64,c256 (1B bf16, 1,024 in / 256 out): new, old, new with --decode-steps 16 (half the Forwards), new
# again, new with the gateway in 4 processes (time left). Read: tok/s, and the Forward timelines' decode -> decode gaps at c256 (run 25: 31 x ~4.4 ms of worker time).
mkdir -p /tmp/r; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
rm -rf /tmp/base && mkdir /tmp/base && tar cf - --exclude=./.whl --exclude=./.jit --exclude=./.baseline --exclude=./bench/results . \
  | tar xf - -C /tmp/base && rm -f /tmp/base/worker_svc/model/greedy.py && cp -r .baseline/worker_svc/. /tmp/base/worker_svc/
diff -rq worker_svc /tmp/base/worker_svc | grep -v pycache
NEW=$PWD
S() { n=$1; dir=$2; shift 2; ok 430 || return; (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 125 python3 -m bench.serve_bench --gpu \
  --phases c64,c256 --out /tmp/r/$n "$@" > /tmp/r/$n.txt 2>&1); kill_stack; rm -rf /tmp/r/$n/logs
  echo "$n: $(grep -E 'c64:|c256:' /tmp/r/$n.txt | cut -c1-170)"; python3 -m bench.forward_timeline /tmp/r/$n/forwards.tsv 2>&1 | grep -E "segment|gap extend->extend|gap decode->decode" | head -8; pack; }
S new1 $NEW; S old1 /tmp/base; S k16 $NEW --decode-steps 16; S new2 $NEW; S gw4 $NEW --gateway-flags=--workers=4
pack; echo "done after $(( $(date +%s) - TS )) s"
