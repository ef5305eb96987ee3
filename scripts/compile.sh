#!/usr/bin/env bash
# Byte-code for every module Arena imports (scripts/compile_imports.py), once per install of .venv,
# and for Arena's own modules (an editable install leaves them as source; up-to-date files are
# skipped): with PYTHONDONTWRITEBYTECODE set, every process (a test run starts hundreds) would
# compile them again, about a CPU-second each. scripts/install.sh runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f .venv/.arena-compiled ] || [ .venv/.arena-installed -nt .venv/.arena-compiled ]; then
  PYTHONDONTWRITEBYTECODE= .venv/bin/python scripts/compile_imports.py
  touch .venv/.arena-compiled
fi
.venv/bin/python -m compileall -q -j 0 app arena bench consumers environments lake producers \
  sandbox simulator streams synthesis trainer >/dev/null
