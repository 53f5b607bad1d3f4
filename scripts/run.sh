#!/usr/bin/env bash
# Install distgemm, then run the main job: a distributed GEMM on the GPUs present, or, without a
# GPU, the same plan on the CPU reference executor at a Llama-3-8B shape. Arguments go to
# `python3 -m distgemm` (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${PYTHON:-python3}" -m distgemm "$@"
