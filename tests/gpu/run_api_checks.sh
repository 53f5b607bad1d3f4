#!/usr/bin/env bash
# The Python API checks on a Hopper machine at TP = every visible GPU (DISTGEMM_TEST_TP sets
# another), in one call:
#   bash tests/gpu/run_api_checks.sh
# Uses a distgemm importable from PYTHONPATH when it has the CUDA runtime (e.g. a prebuilt
# package carried in .whl/py312), else builds and installs the repository here (log kept).
# Writes logs and the worker's JSON to $OUT (default ./gpu-logs).
set -u
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv; nvidia-smi topo -m
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } > "$OUT/env.txt" 2>&1
if ! python3 -c "import distgemm._core as c, sys; sys.exit(0 if c.cuda_runtime else 1)" 2>/dev/null; then
  echo "building distgemm here" | tee "$OUT/build.log"
  python3 -m pip install -q --no-index --no-deps .whl/nvidia_cutlass-*.whl >> "$OUT/build.log" 2>&1
  python3 -m pip install -v --no-index --no-build-isolation --no-deps . >> "$OUT/build.log" 2>&1 \
    || { tail -40 "$OUT/build.log"; exit 1; }
fi
python3 -c "import distgemm, distgemm._core as c; print('distgemm from', distgemm.__file__, 'cuda_runtime', c.cuda_runtime)" >> "$OUT/env.txt"
rc=0
python3 -m pytest -q tests/test_api_validation.py 2>&1 | tail -1
export DISTGEMM_TEST_LOG="$OUT/torchrun.log" DISTGEMM_TEST_RESULTS="$OUT"
DISTGEMM_TORCHRUN_TIMEOUT=${API_TIMEOUT:-240} python3 -m pytest -q -rA \
  tests/gpu/test_torchrun_api.py -k "not test_python_path" > "$OUT/pytest_api.log" 2>&1 || rc=1
tail -15 "$OUT/pytest_api.log"
python3 - "$OUT/torchrun_api.json" <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
print("checks", len(d["results"]), "failed", d["failed"], "skipped", [s["name"] for s in d["skipped"]])
for e in d["results"]:
    if not e["ok"] or e["name"].startswith(("overhead", "replays", "paths/auto", "errors/missing")):
        print(json.dumps(e)[:600])
PY
DISTGEMM_BENCH=1 DISTGEMM_BENCH_OUT="$OUT/bench.txt" DISTGEMM_TORCHRUN_TIMEOUT=120 python3 -m pytest -q \
  tests/gpu/test_torchrun_api.py::test_python_path_within_2_percent_of_cpp > "$OUT/pytest_bench.log" 2>&1 || rc=1
tail -4 "$OUT/pytest_bench.log"; cut -c1-200 "$OUT/bench.txt" 2>/dev/null
timeout 120 torchrun --nproc-per-node "${DISTGEMM_TEST_TP:-$(nvidia-smi -L | wc -l)}" examples/tp_mlp.py > "$OUT/tp_mlp.log" 2>&1; echo "tp_mlp rc=$?"
grep tp_mlp: "$OUT/tp_mlp.log"
python3 -m pytest -q -rA tests/gpu/test_training.py > "$OUT/pytest_training.log" 2>&1 || rc=1
tail -8 "$OUT/pytest_training.log"
exit $rc
