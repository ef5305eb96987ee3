#!/usr/bin/env bash
# Installs Arena (scripts/install.sh), makes sure the test servers' binaries exist, checks lint, format,
# types and import rules, then runs the tests.
# Tests start their own servers (Kafka-protocol broker, S3, PostgreSQL) on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's end, in seconds since the start, goes to the log: where CI's minutes go.
SECONDS=0
step() { echo "[test.sh] $1: done at ${SECONDS}s" >&2; }
# The side virtualenvs and the Debian packages install in the background while Arena's own install,
# lint and types run (CI's clean machine: minutes each, mostly waiting on downloads and disk); every
# job is waited for before pytest, and a failed one fails the run (set -e on `wait`). Each side
# virtualenv is made from the system's Python: .venv may not exist yet.
PYTHON=$(command -v python3.11 || command -v python3)
export PYTHON
# verl in a second virtualenv: tests/test_verl_parity.py compares the GRPO math with verl's core_algos.
# bfcl-eval in a third: `arena eval --bench bfcl` runs its checkers there (tests/test_bfcl.py).
# tau2-bench in a fourth: tests/test_tau2.py imports its domains, gold replay vs tau2's own evaluator.
side=()
(bash scripts/install_verl.sh && step .venv-verl) & side+=($!)
(bash scripts/install_bfcl.sh && step .venv-bfcl) & side+=($!)
(bash scripts/install_tau2.sh && step .venv-tau2) & side+=($!)
# Debian packages the test servers need, installed only when missing (CI's clean machine).
apt_install() {
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
debian_packages() {
  local wanted=()
  if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    echo "installing Debian's PostgreSQL server for the catalog tests"
    wanted+=(postgresql)
  fi
  if [ ! -x /usr/bin/chromium ]; then
    echo "installing Debian's Chromium for the dashboard's browser test (tests/test_ui_browser.py)"
    wanted+=(chromium)
  fi
  if [ ${#wanted[@]} -gt 0 ]; then apt_install "${wanted[@]}"; fi
}
(debian_packages && step "Debian packages") & side+=($!)
# Arena's install, byte-code included (compiling it beside lint and types instead made neither
# sooner: this part of the run keeps both cores busy too).
bash scripts/install.sh
step install
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
# The tests' processes write the byte-code of what they import: scripts/install.sh compiles only
# what Arena imports, and a module it missed is then compiled once, not by every process.
export PYTHONDONTWRITEBYTECODE=
# Style and types first: a lint or type error fails CI before the tests spend their minutes.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
step ruff
.venv/bin/mypy --num-workers 2
step mypy
.venv/bin/python tests/import_rules.py
for job in "${side[@]}"; do wait "$job"; done
step "side installs"
# Three workers on 2 cores: a test waits on its servers and subprocesses part of the time, and with two
# workers the cores idled 15% of the run; with three they are busy 96-98% of it (pytest 1,478 s ->
# 1,204 s here, on code two small test mends apart). tests/conftest.py groups what must share one,
# and orders the heaviest groups first (--no-loadscope-reorder keeps that order: xdist would
# otherwise hand out groups by test count, leaving single-test benches of minutes for the end).
# --durations: the slowest items close the log, where CI shows it.
exec .venv/bin/python -m pytest -q -n 3 --dist loadgroup --no-loadscope-reorder --durations=30 "$@"
