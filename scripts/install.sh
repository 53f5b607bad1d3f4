#!/usr/bin/env bash
# Installs distgemm into the current python3 with everything it needs (used by run.sh, CI and the
# README's test command).
#   - torch: a machine without torch gets the pinned CPU build (torch==2.13.0) before anything else,
#     so no dependency range can pull a multi-GB CUDA build; a GPU machine keeps its own torch.
#   - the build runs without isolation, from build tools installed here first (scikit-build-core,
#     pybind11, CMake, ninja, and nvidia-cutlass, whose wheel carries the CUTLASS headers).
#   - the CUDA runtime and examples are built where they can run: a GPU is visible (nvidia-smi -L
#     lists one, or /dev/nvidia0 exists) or DISTGEMM_CUDA=ON is set, and nvcc is found. Elsewhere
#     the host-only core is built (about a minute; the CUDA runtime takes 20+ minutes on 2 cores)
#     and one line says so; DISTGEMM_CUDA=OFF skips the runtime everywhere.
#   - the long steps print their progress: pip's downloads and the build's [n/N] steps; the full
#     log is kept in a temporary file and its end is printed when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRA=${1:-}
LOG=$(mktemp "${TMPDIR:-/tmp}/distgemm-install.XXXXXX")

# Runs pip with its output in $LOG, printing the lines that show progress: downloads, installs,
# scikit-build-core's phases and ninja's steps (done/total, seconds so far, the file built).
export NINJA_STATUS="[%f/%t %es] "
# A line at a time as it arrives (awk implementations such as mawk read their input in blocks, so
# a long build would print nothing until its end).
show_progress() {
  local line step='^ *\[([0-9]+/[0-9]+) ([0-9]+)(\.[0-9]+)?s\] (.*[ /])?([^ /]+)$'
  while IFS= read -r line; do
    if [[ $line =~ $step ]]; then
      echo "  [${BASH_REMATCH[1]} ${BASH_REMATCH[2]}s] ${BASH_REMATCH[5]%.o}"
    elif [[ $line =~ ^\ *(\*\*\*\ (Configuring|Building|Installing).*) ]]; then
      echo "  ${BASH_REMATCH[1]}"
    elif [[ $line =~ ^\ *((Downloading|Successfully\ installed)\ .*) ]]; then
      echo "  ${BASH_REMATCH[1]}"
    fi
  done
}
pip_with_progress() {
  local rc=0
  "$PY" -m pip "$@" 2>&1 | tee "$LOG" | show_progress || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "distgemm: pip $1 failed (exit $rc); the end of its log ($LOG):" >&2
    tail -n 60 "$LOG" >&2
    exit "$rc"
  fi
}

gpu_visible() {
  { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; } ||
    [ -e /dev/nvidia0 ]
}

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "distgemm: installing torch==2.13.0 (the CPU build, about a minute)"
  pip_with_progress install torch==2.13.0
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
  echo "distgemm: installing the build tools"
  pip_with_progress install "scikit-build-core>=0.10" "pybind11>=2.12" "cmake>=3.26" ninja numpy \
      "nvidia-cutlass==4.2.0.0"
fi
if [ -z "${DISTGEMM_CUDA:-}" ]; then
  if gpu_visible; then
    export DISTGEMM_CUDA=ON
  else
    export DISTGEMM_CUDA=OFF
    # _core.cuda_runtime_reason (CMakeLists.txt reads it)
    export DISTGEMM_CUDA_OFF_REASON="no GPU visible at install"
    echo "distgemm: no GPU visible: building the host-only core (plans, simulator, CPU reference" \
      "executor); DISTGEMM_CUDA=ON bash scripts/install.sh builds the CUDA runtime too"
  fi
fi
if [ "$DISTGEMM_CUDA" != "OFF" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
# cuBLASLt's header for the CUDA runtime's cuBLASLt candidate (cpp/cuda.cmake): torch's CUDA
# wheels bring it (nvidia-cublas); a machine with a CPU torch and no toolkit copy gets that wheel.
have_cublaslt_header() {
  [ -e /usr/local/cuda/include/cublasLt.h ] || "$PY" - <<'PY'
import importlib.util, os, sys
spec = importlib.util.find_spec("nvidia")
dirs = [os.path.join(p, d, "include") for p in (spec.submodule_search_locations if spec else []) for d in os.listdir(p)]
sys.exit(0 if any(os.path.exists(os.path.join(d, "cublasLt.h")) for d in dirs) else 1)
PY
}
if [ "$DISTGEMM_CUDA" != "OFF" ] && ! have_cublaslt_header; then
  if [ "${DISTGEMM_OFFLINE:-0}" = "1" ]; then
    echo "distgemm: no cublasLt.h here and DISTGEMM_OFFLINE=1: the cuBLASLt candidate is left out"
  else
    echo "distgemm: installing nvidia-cublas (cuBLASLt's header for the CUDA build)"
    pip_with_progress install "nvidia-cublas==13.1.0.3"
  fi
fi
if [ "$DISTGEMM_CUDA" != "OFF" ]; then
  echo "distgemm: building the CUDA runtime too (about 17 minutes on 2 cores, 2 on 16)"
elif [ -z "${DISTGEMM_CUDA_OFF_REASON:-}" ]; then
  echo "distgemm: DISTGEMM_CUDA=OFF: building the host-only core"
fi
# --no-deps only where offline (the GPU machine); elsewhere pip resolves numpy, pybind11, ... itself.
DEPS=()
if [ "${DISTGEMM_OFFLINE:-0}" = "1" ]; then
  DEPS=(--no-deps)
fi
pip_with_progress install -v --no-build-isolation "${DEPS[@]}" ".${EXTRA}"
# What was built, where it is not what was asked for (DISTGEMM_CUDA=ON without a CUDA compiler).
if [ "$DISTGEMM_CUDA" != "OFF" ]; then
  (cd / && "$PY" -c 'from distgemm import _core as c
if not c.cuda_runtime:
    print(f"distgemm: installed without the CUDA runtime: {c.cuda_runtime_reason}; put nvcc on "
          "PATH (or set CUDACXX) and run again")')
fi
rm -f "$LOG"
