#!/usr/bin/env bash
# Creates .venv-bfcl (once): a second virtualenv with bfcl-eval, whose checkers `arena eval --bench bfcl`
# runs (trainer/benchmarks/bfcl_checker.py) and whose bundled questions it reads. bfcl-eval pins
# numpy==1.26.4, networkx==3.3 and filelock==3.20.0, which would move Arena's own resolve, so it gets a
# virtualenv of its own, as verl does (scripts/install_verl.sh). torch is pinned by constraints.txt.
# tests/test_embed.py runs its sentence-transformers reference here too (a bfcl-eval dependency): in
# the main virtualenv it would bring scikit-learn, which transformers imports with every model.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv_install.sh
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv-bfcl
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
stamp=$VENV/.arena-bfcl-installed
if [ ! -f "$stamp" ] || [ constraints.txt -nt "$stamp" ] || [ scripts/install_bfcl.sh -nt "$stamp" ]; then
  # torch first (sentence-transformers, a bfcl-eval dependency, needs it): the local CPU wheel.
  venv_install --no-compile "$VENV" -c constraints.txt "torch==2.13.0"
  # soundfile: bfcl-eval imports it (through qwen-agent) without declaring it.
  venv_install --no-compile "$VENV" -c constraints.txt "bfcl-eval==2026.3.23" "soundfile"
  # Byte-code for what its checker imports (trainer/benchmarks/bfcl_checker.py), and for the
  # sentence-transformers reference of tests/test_embed.py (tests/embed_reference.py).
  compile_imports "$VENV" sentence_transformers transformers.models.bert.modeling_bert \
    bfcl_eval.eval_checker.ast_eval.ast_checker \
    bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils \
    bfcl_eval.constants.model_config bfcl_eval.constants.type_mappings bfcl_eval.model_handler.utils bfcl_eval.utils
  touch "$stamp"
fi
