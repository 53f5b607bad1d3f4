#!/usr/bin/env bash
# Download the wheels that benchmarks/training/titan_async_tp.py needs beyond the GPU machine's
# image into .whl/titan/ (ignored by git; carried to the GPU machine with `.whl`): torchtitan
# 0.2.2 and the requirements of its imports that the image lacks (benchmarks/training/TITAN.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=(
  torchtitan==0.2.2 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1
  torchdata==0.11.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
)
mkdir -p .whl/titan
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  -d .whl/titan "${WHEELS[@]}"
ls -l .whl/titan
