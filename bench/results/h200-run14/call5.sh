#!/bin/bash
# H200 run 14 call 5 (inline on the warm machine after call 4; recorded here): the editor with
# --worker-flags "--extend-attention fa2", with CODESERVE_SWITCH_INTERVAL_US=100 and again without.
for v in fa2_100us fa2_again; do
  if [ $v = fa2_100us ]; then export CODESERVE_SWITCH_INTERVAL_US=100; else unset CODESERVE_SWITCH_INTERVAL_US; fi
  python3 -m bench.editor_bench --gpu --out /tmp/r/c5/$v --typists 20 --duration 15 --modes psm --context-files 4 \
    --worker-flags "--extend-attention fa2" --hop-trace /tmp/r/c5/hops_$v > /tmp/r/c5_$v.txt 2>&1
done
