#!/usr/bin/env bash
# Creates .venv-verl (once): a second virtualenv with verl, used only by tests/test_verl_parity.py
# (the default install never needs verl). torch is pinned by constraints.txt, as in scripts/install.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv_install.sh
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv-verl
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
stamp=$VENV/.arena-verl-installed
if [ ! -f "$stamp" ] || [ constraints.txt -nt "$stamp" ] || [ scripts/install_verl.sh -nt "$stamp" ]; then
  # torch first: its CPU wheel is local; the constraint keeps verl's resolve on it (no CUDA wheels).
  venv_install --no-compile "$VENV" -c constraints.txt "torch==2.13.0"
  venv_install --no-compile "$VENV" -c constraints.txt "verl==0.9.1"
  # The exported verl tool runs calls in Arena's sandbox (repo on PYTHONPATH); arena.config needs this.
  venv_install --no-compile "$VENV" -c constraints.txt "pydantic-settings>=2.3"
  # Byte-code for what the parity tests import (tests/verl_reference.py, tests/verl_tool_check.py).
  compile_imports "$VENV" verl.trainer.ppo.core_algos verl.workers.config.actor omegaconf verl.tools.base_tool \
    verl.tools.tool_registry verl.utils.dataset.rl_dataset pydantic_settings
  touch "$stamp"
fi
