#!/usr/bin/env bash
# Install distgemm, then run the main job: a distributed GEMM on the GPUs present, or, without a
# GPU, the same plan on the CPU reference executor at a Llama-3-8B shape. Without a GPU the install
# builds the host-only core (a few minutes in all, most of it torch's download; install.sh says
# how to build the CUDA runtime too). Arguments go to `python3 -m distgemm` (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${PYTHON:-python3}" -m distgemm "$@"
