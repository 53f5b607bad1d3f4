#!/usr/bin/env bash
# Install distgemm with its test extra, then run the whole test suite (CPU tests always; GPU tests
# skip with their reason when no suitable GPU is present). pytest's exit code is this script's.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh "[test]"
exec "${PYTHON:-python3}" -m pytest -q tests "$@"
