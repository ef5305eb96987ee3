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
  # --no-compile: byte-code for all 20,000 files was 100 of the install's 110 CPU-seconds, and
  # Arena's processes import a quarter of them; scripts/compile.sh compiles those.
  venv_install --no-compile .venv -c constraints.txt "torch==2.13.0"
  # bench: TRL, for bench/trainer.py's baseline (CI runs every bench's --quick: tests/test_bench_quick.py)
  venv_install --no-compile .venv -c constraints.txt -e ".[dev,bench]"
  touch "$stamp"
fi
bash scripts/compile.sh
