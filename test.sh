#!/usr/bin/env bash
# Sets up (first run only) and runs the whole CPU test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh dev
exec .venv/bin/python -m pytest "$@"
