#!/usr/bin/env bash
# Creates .venv (once) and installs the pinned requirements into it. Idempotent and quiet when done.
# Usage: scripts/setup.sh [dev]
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$py" -m venv .venv
req=requirements.txt
[ "${1:-}" = dev ] && req=requirements-dev.txt
stamp=.venv/.installed-$(sha256sum requirements.txt requirements-dev.txt | sha256sum | cut -c1-16)-${1:-run}
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -r "$req"
  touch "$stamp"
fi
