#!/usr/bin/env bash
# Session 15 call 2 (fresh machine, TP = every GPU): install with the cuBLASLt heuristic cache keyed
# without an unbatched GEMM's batch strides, and row buckets of 3 significant bits; the plan tests
# (the fp8 mixed kinds as offered); first calls at TP = every GPU and TP = 2; the buckets' steady
# state on row counts inside buckets (1400 -> 1536, 5000 -> 5120), on/off/on.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
DISTGEMM_TEST_TP=$NG DISTGEMM_TEST_RESULTS=$S/results timeout 120 python3 -m pytest -q -rs tests/gpu/test_cublaslt_plans.py > $S/plans-tests.log 2>&1
echo "plans tests rc=$?"; tail -2 $S/plans-tests.log; el plans-tests; pack
OUT=$S bash benchmarks/run_on_gpus.sh first-calls > $S/parts2.log 2>&1; tail -1 $S/parts2.log
grep -E "first call ms|graph  |heuristic  |preload  " $S/first-calls.log | cut -c1-140; el first-calls; pack
mkdir -p $S/buckets
per=$(( (48 + NG - 1) / NG ))
for pass in on off on2; do
  for i in $(seq 0 $((NG - 1))); do
    CUDA_VISIBLE_DEVICES=$i DISTGEMM_CUBLASLT_ROW_BUCKETS=${pass%2} timeout 150 python3 -m benchmarks.kernel.kernel_vs_cublas \
      --tp 4,8 --tokens 1400,5000 --local-only --configs "" --kernel-table shipped --skip $((i * per)) --limit $per \
      --budget-s 120 --out $S/buckets --stem $pass-$i > $S/buckets/$pass-$i.log 2>&1 &
  done
  wait; el "buckets $pass"; pack
done
pack; rm -rf $S; ls $OUT
