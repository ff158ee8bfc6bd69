#!/bin/bash
# Session 30 call 4 (warm machine after call 3; ~95 s of device time left): c64 with the gateway ending the answer at
# the last message (this tree) against the gateway before it. generation_before.py was `git show 517c4b5^:gateway/generation.py`,
# written here before the call (removed from the tree afterwards: a copy of a module).
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
kill_stack; rm -rf /tmp/gb && mkdir /tmp/gb && tar cf - --exclude=./.whl --exclude=./.jit2 --exclude=./bench/results . | tar xf - -C /tmp/gb
cp bench/results/h200-run30/generation_before.py /tmp/gb/gateway/generation.py
for arm in new:$PWD before:/tmp/gb; do n=${arm%%:*}; d=${arm#*:}
  (cd $d && PYTHONPATH=/tmp/site:$d timeout 42 python3 -m bench.serve_bench --gpu --phases c64 --out $OUT/$n > $OUT/$n.txt 2>&1)
  kill_stack; rm -rf $OUT/$n/logs; echo "== $n"; grep "c64:" $OUT/$n.txt | cut -c24-330; done
