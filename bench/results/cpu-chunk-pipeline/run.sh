#!/bin/sh
# The runs behind README.md here (repo root; simulated worker, real loop and cache; see tests/scheduler/arrival_sim.py).
set -e
D=bench/results/cpu-chunk-pipeline; R=${R:-1}  # R: repeat index in the file names
for rtt in 0.3 1; do
  for mode in chunk-pipeline no-chunk-pipeline; do
    # 8-chunk prompts: 4,000 tokens, chunk 512 (8 prompts one at a time, then 8 at 4 clients)
    .venv/bin/python -m tests.scheduler.arrival_sim --long 8 --prompt-len 4000 --chunk-size 512 --concurrency 4 \
      --rtt-ms $rtt --$mode --json $D/long8-rtt$rtt-$mode-r$R.json 2>/dev/null | grep "long prompts"
    # the c64 shape: 64 prompts of 1,024 tokens at once, chunk 8,192 (8 extends of whole prompts)
    .venv/bin/python -m tests.scheduler.arrival_sim --long 64 --prompt-len 1024 --chunk-size 8192 --concurrency 64 \
      --rtt-ms $rtt --$mode --json $D/burst64-rtt$rtt-$mode-r$R.json 2>/dev/null | grep "long prompts"
  done
done
