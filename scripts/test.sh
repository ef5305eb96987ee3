#!/usr/bin/env bash
# Installs Arena (scripts/install.sh), makes sure the test servers' binaries exist, checks lint, format,
# types and import rules, then runs the tests.
# Tests start their own servers (Kafka-protocol broker, S3, PostgreSQL) on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# verl in a second virtualenv: tests/test_verl_parity.py compares the GRPO math with verl's core_algos.
bash scripts/install_verl.sh
# bfcl-eval in a third: `arena eval --bench bfcl` runs its checkers there (tests/test_bfcl.py).
bash scripts/install_bfcl.sh
# tau2-bench in a fourth: tests/test_tau2.py imports its domains, gold replay vs tau2's own evaluator.
bash scripts/install_tau2.sh
# Debian packages the test servers need, installed only when missing (CI's clean machine).
apt_install() {
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  echo "installing Debian's PostgreSQL server for the catalog tests"
  apt_install postgresql
fi
if [ ! -x /usr/bin/chromium ]; then
  echo "installing Debian's Chromium for the dashboard's browser test (tests/test_ui_browser.py)"
  apt_install chromium
fi
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
# Style and types first: a lint or type error fails CI before the tests spend their minutes.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python tests/import_rules.py
# Two workers: much of a test is waiting on its servers; tests/conftest.py groups what must share one.
# --durations: the slowest items close the log, where CI shows it.
exec .venv/bin/python -m pytest -q -n 2 --dist loadgroup --durations=30 "$@"
