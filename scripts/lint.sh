#!/usr/bin/env bash
# Lint and format checks, as CI runs them: ruff (lint + format, configured in pyproject.toml) on
# the Python, clang-format (.clang-format) on the C++/CUDA. `--fix` rewrites instead of checking.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip install -q "ruff==0.17.6" "clang-format==23.1.5"
mapfile -t cxx < <(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
  ruff format . && ruff check --fix . && clang-format -i "${cxx[@]}"
else
  ruff check . && ruff format --check . && clang-format --dry-run --Werror "${cxx[@]}"
fi
