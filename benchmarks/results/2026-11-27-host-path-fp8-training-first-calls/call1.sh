#!/usr/bin/env bash
# Next session call 1 (4 GPUs), on a branch with h-host merged: install; GPU tests of the router
# change and of the graph-cache policy (direct launches): async_tp_switch, fp8_ops, workspace,
# capture; the API checks (10,000 changing-pointer calls, host overhead with us_direct_launch).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S $S/titan
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W11\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this run)'
OUT=$S GPU_TESTS="async_tp_switch fp8_ops workspace capture" GPU_TEST_S=120 bash benchmarks/run_on_gpus.sh gpu-tests > $S/parts2.log 2>&1
grep "== test_\|passed\|failed\|error" $S/parts2.log | head; el gpu-tests
OUT=$S bash benchmarks/run_on_gpus.sh api > $S/parts3.log 2>&1  # 10,000 changing-pointer calls (direct launches), overhead incl. us_direct_launch
grep -i "passed\|failed\|overhead\|direct" $S/parts3.log | head; el api
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
