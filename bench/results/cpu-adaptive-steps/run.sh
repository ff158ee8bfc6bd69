#!/bin/sh
# The A/B of bench/results/cpu-adaptive-steps: adaptive decode steps on and off, on the simulated worker
# (tests/scheduler/arrival_sim.py: real loop and cache, 2 ms a decode step + 0.3 ms a decode Forward, K = 8),
# B requests decoding and open-loop Poisson probes (128-token prompts, 1 output token) at R a second for 4 s.
# Usage: sh bench/results/cpu-adaptive-steps/run.sh OUT_DIR [REPS]
out=${1:?out dir}; reps=${2:-2}
mkdir -p "$out"
for rep in $(seq 1 "$reps"); do
  for bg in 16 64; do
    for rate in 10 50 200; do
      for mode in adaptive-steps no-adaptive-steps; do
        .venv/bin/python -m tests.scheduler.arrival_sim --background "$bg" --rate "$rate" --seconds 4 --prompt-len 128 \
          --step-ms 2 --decode-forward-ms 0.3 --decode-steps 8 --"$mode" \
          --json "$out/bg${bg}-r${rate}-${mode}-${rep}.json" 2>/dev/null | tail -3
      done
    done
  done
done
