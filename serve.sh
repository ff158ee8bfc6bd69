#!/usr/bin/env bash
# Sets up (first run only) and starts cache, worker, scheduler and gateway on the embedded default model.
# Serves http://127.0.0.1:8000 ; Ctrl-C stops everything. Extra flags go to the launcher (see --help).
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
exec .venv/bin/python -m launcher "$@"
