#!/usr/bin/env bash
# Session 16 call 1 (fresh machine, TP = every GPU): install; the flag probe under `all` (lazy
# module loading, then EAGER if it fails) and under the default; test_cublaslt_plans.py; the
# multi-rank GPU tests touched by the new enqueue order (fused, capture, workspace, torchrun_api).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
probe() {  # probe NAME ENV...
  local n=$1; shift
  env "$@" timeout -k 5 75 torchrun --nproc-per-node $NG -m benchmarks.probes.cublaslt_plan_flags > $S/probe-$n.log 2>&1
  local r=$?; echo "== probe $n rc=$r"; grep -E "^rank ?0|FAIL" $S/probe-$n.log | cut -c1-190 | head -12; el "probe $n"; pack
  return $r
}
probe all DISTGEMM_KERNEL_TABLE_PLANS=all || probe all-eager DISTGEMM_KERNEL_TABLE_PLANS=all CUDA_MODULE_LOADING=EAGER
probe default
DISTGEMM_TEST_TP=$NG DISTGEMM_TEST_RESULTS=$S/results timeout 120 python3 -m pytest -q -rs tests/gpu/test_cublaslt_plans.py > $S/plans-tests.log 2>&1
echo "plans tests rc=$?"; tail -4 $S/plans-tests.log; el plans-tests; pack
GPU_TESTS="fused capture workspace torchrun_api" GPU_TESTS_S=290 OUT=$S bash benchmarks/run_on_gpus.sh gpu-tests > $S/parts2.log 2>&1
grep -E "rc=|passed|failed" $S/parts2.log | head -20; el gpu-tests
pack; rm -rf $S; ls $OUT
