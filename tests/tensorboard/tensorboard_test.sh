#!/usr/bin/env bash
# Runs tensorboard_test.py with the python that has the `tensorboard` package: TESSERA_PYTHON, or
# the repository's .venv (launch/setup installs it there). Without it the test fails, unless
# TESSERA_PYTHON names a python without network access to pip (then it is skipped: exit 77).
# Usage: tensorboard_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=${1:?usage: tensorboard_test.sh SOURCE_DIR BUILD_DIR}
build=${2:?usage: tensorboard_test.sh SOURCE_DIR BUILD_DIR}
py=${TESSERA_PYTHON:-$src/.venv/bin/python}
if ! "$py" -c 'import tensorboard, PIL, numpy' 2>/dev/null; then
  if [ -n "${TESSERA_PYTHON:-}" ]; then
    echo "SKIP: TESSERA_PYTHON=$TESSERA_PYTHON has no tensorboard/PIL/numpy to read the files with"
    exit 77
  fi
  echo "$py cannot import tensorboard, PIL and numpy: run launch/setup" >&2
  exit 1
fi
exec "$py" "$(dirname "${BASH_SOURCE[0]}")/tensorboard_test.py" "$build" "$src"
