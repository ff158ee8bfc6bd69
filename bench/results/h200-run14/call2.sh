#!/bin/bash
# H200 run 14 call 2: the editor bench (tiny, 20 typists, PSM) with the hop trace, and py-spy on every service
# process for 6 s in the middle (--gil: the samples of the thread holding the GIL, i.e. the Python work).
mkdir -p /tmp/r/spy; python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy*.whl; ls /tmp/spy/bin
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
python3 -m bench.editor_bench --gpu --out /tmp/r/ed --typists 20 --duration 15 --modes psm --context-files 4 --hop-trace /tmp/r/ed/hops > /tmp/r/ed.txt 2>&1 &
B=$!
for i in $(seq 90); do pgrep -f gateway >/dev/null && break; sleep 1; done; echo "gateway after $i s"; sleep 6
for s in gateway scheduler_svc cache_svc worker_svc; do
  for p in $(pgrep -f "$s" | head -2); do
    timeout 20 /tmp/spy/bin/py-spy record -p $p -d 6 -r 250 --gil -f raw -o /tmp/r/spy/$s.txt > /tmp/r/spy/$s.log 2>&1 &
  done
done
wait $B; wait
tail -c 3000 /tmp/r/ed.txt; ps aux | grep -c python3; pack
