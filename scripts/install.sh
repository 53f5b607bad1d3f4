#!/usr/bin/env bash
# Installs distgemm into the current python3 with everything it needs (used by run.sh, CI and the
# README's test command).
#   - torch: a machine without torch gets the pinned CPU build (torch==2.13.0) before anything else,
#     so no dependency range can pull a multi-GB CUDA build; a GPU machine keeps its own torch.
#   - the build runs without isolation, from build tools installed here first (scikit-build-core,
#     pybind11, CMake, ninja, and nvidia-cutlass, whose wheel carries the CUTLASS headers).
#   - the CUDA runtime and examples are built when nvcc is found (DISTGEMM_CUDA=OFF skips them).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRA=${1:-}

if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q torch==2.13.0
fi
have_build_tools() {
  "$PY" - <<'PY'
import importlib.util, shutil, subprocess, sys
if not all(importlib.util.find_spec(n) for n in ("scikit_build_core", "pybind11", "cutlass_library", "numpy")):
    sys.exit(1)
if not (shutil.which("ninja") or importlib.util.find_spec("ninja")):
    sys.exit(1)
cmake = shutil.which("cmake")
out = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout if cmake else ""
version = tuple(int(x) for x in out.split()[2].split(".")[:2]) if out else (0, 0)
sys.exit(0 if version >= (3, 26) else 1)
PY
}
if ! have_build_tools; then
  "$PY" -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.12" "cmake>=3.26" ninja numpy \
      "nvidia-cutlass==4.2.0.0"
fi
if [ -z "${DISTGEMM_CUDA:-}" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
# --no-deps only where offline (the GPU machine); elsewhere pip resolves numpy, pybind11, ... itself.
if [ "${DISTGEMM_OFFLINE:-0}" = "1" ]; then
  "$PY" -m pip install -q --no-build-isolation --no-deps ".${EXTRA}"
else
  "$PY" -m pip install -q --no-build-isolation ".${EXTRA}"
fi
