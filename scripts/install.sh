#!/usr/bin/env bash
# Creates .venv (once) and installs Arena with its dev extras, torch pinned by constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv_install.sh
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.arena-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
  # torch first: its CPU wheel is local; the constraint keeps every later resolve on it.
  venv_install .venv -c constraints.txt "torch==2.13.0"
  # bench: TRL, for bench/trainer.py's baseline (CI runs every bench's --quick: tests/test_bench_quick.py)
  venv_install .venv -c constraints.txt -e ".[dev,bench]"
  touch "$stamp"
fi
# Arena's own modules compiled once (an editable install leaves them as source): with
# PYTHONDONTWRITEBYTECODE set, every process (a test run starts hundreds) compiles them again
# otherwise, about a CPU-second each. Up-to-date files are skipped.
.venv/bin/python -m compileall -q -j 0 app arena bench consumers environments lake producers \
  sandbox simulator streams synthesis trainer >/dev/null
