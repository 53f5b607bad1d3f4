#!/usr/bin/env bash
# Session 14 call 4 (fresh machine, TP = every GPU): install with the shipped row-wise fp8 rows and
# cublaslt_rank_to_run (a table row's rank from the row bucket's list); the cuBLASLt kernel tests
# (fp8 on GPU 0; bf16, table and buckets on GPU 1); the plan tests; first calls under all /
# one-rank; the fp8 ops' GPU tests (row-wise plans now run cuBLASLt steps from the table).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -q -rs tests/gpu/test_kernel_fp8.py -k cublaslt > $S/fp8-tests.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -m pytest -q -rs tests/gpu/test_kernel_gemm.py -k "cublaslt or kernel_table" > $S/kernel-tests.log 2>&1 &
wait
echo "== fp8"; tail -2 $S/fp8-tests.log; echo "== kernel"; tail -2 $S/kernel-tests.log; el tests
DISTGEMM_TEST_TP=$NG DISTGEMM_TEST_RESULTS=$S/results timeout 100 python3 -m pytest -q -rs tests/gpu/test_cublaslt_plans.py > $S/plans-tests.log 2>&1
echo "plans tests rc=$?"; tail -2 $S/plans-tests.log; el plans-tests; pack
OUT=$S bash benchmarks/run_on_gpus.sh first-calls > $S/parts2.log 2>&1; tail -1 $S/parts2.log
grep -E "first call ms|graph  " $S/first-calls.log | cut -c1-120; tail -n 7 $S/first-calls.log; el first-calls; pack
OUT=$S GPU_TESTS="fp8_ops" GPU_TEST_S=170 bash benchmarks/run_on_gpus.sh gpu-tests > $S/parts3.log 2>&1; tail -1 $S/parts3.log
tail -n 14 $S/gpu-tests.log | cut -c1-200; el fp8-ops
pack; rm -rf $S; ls $OUT
