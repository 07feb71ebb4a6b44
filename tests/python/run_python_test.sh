#!/usr/bin/env bash
# Runs one of the Python CTests (tests/<name>/<name>_test.py) with the python that has the modules
# it reads results with: TESSERA_PYTHON, or the repository's .venv (launch/setup installs them
# there). Without them the test fails, unless TESSERA_PYTHON names another python (one without
# network access to pip): then it is skipped (exit 77). tests/python/ is on the script's path
# (checks.py).
# Usage: run_python_test.sh SOURCE_DIR BUILD_DIR SCRIPT MODULE...
set -euo pipefail
src=${1:?usage: run_python_test.sh SOURCE_DIR BUILD_DIR SCRIPT MODULE...}
build=${2:?usage: run_python_test.sh SOURCE_DIR BUILD_DIR SCRIPT MODULE...}
script=${3:?usage: run_python_test.sh SOURCE_DIR BUILD_DIR SCRIPT MODULE...}
shift 3
modules=$(IFS=,; echo "$*")
py=${TESSERA_PYTHON:-$src/.venv/bin/python}
if ! "$py" -c "import $modules" 2>/dev/null; then
  if [ -n "${TESSERA_PYTHON:-}" ]; then
    echo "SKIP: TESSERA_PYTHON=$TESSERA_PYTHON cannot import $modules"
    exit 77
  fi
  echo "$py cannot import $modules: run launch/setup" >&2
  exit 1
fi
PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")${PYTHONPATH:+:$PYTHONPATH}" exec "$py" "$script" "$build" "$src"
