#!/bin/bash
# Session 29 call 5: host cost of the arrival path on the accelerator's host: the StepFeed probe, then bench.host_overhead.
python3 bench/results/h200-run29/stepfeed_probe.py 2>&1 | tail -12
timeout 200 python3 -m bench.host_overhead --batches 256 --steps 8 --context 1152 --forwards 10 --warmup 2 --out /tmp/ho 2>&1 | tail -24
