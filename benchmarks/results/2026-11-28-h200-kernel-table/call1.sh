#!/usr/bin/env bash
# Session 12 call 1 (2 or 4 GPUs, TP = every GPU): install; the plans with the table for every
# plan (tests/gpu/test_cublaslt_plans.py: its all_plans section first in a fresh process, the
# lazy-loading check); the cuBLASLt GEMM tests and the fp8 cuBLASLt tests, one GPU each at once;
# then 70B O at 4096 tokens with DISTGEMM_KERNEL_TABLE_PLANS=all (the case that timed out).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed; }
python3 -c 'from distgemm import _core as c; print("cuda_runtime", c.cuda_runtime, "cublaslt", repr(c.cublaslt_problem()), c.cublaslt_version())'
pack
DISTGEMM_TEST_TP=$NG DISTGEMM_TEST_RESULTS=$S/results timeout 150 python3 -m pytest -q -rs tests/gpu/test_cublaslt_plans.py > $S/plans-tests.log 2>&1
echo "plans tests rc=$?"; tail -4 $S/plans-tests.log; el plans-tests
pack
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -rs tests/gpu/test_kernel_fp8.py -k cublaslt > $S/fp8-tests.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m pytest -q -rs tests/gpu/test_kernel_gemm.py -k "cublaslt or kernel_table" > $S/kernel-tests.log 2>&1 &
wait
echo "== fp8"; tail -4 $S/fp8-tests.log; echo "== kernel"; tail -4 $S/kernel-tests.log; el tests
pack
DISTGEMM_KERNEL_TABLE_PLANS=all timeout 90 torchrun --nproc-per-node $NG -m benchmarks.sweep.llama_sweep --models 70B --layers O --tokens 4096 --out $S/sweep-o > $S/sweep-o.log 2>&1
echo "sweep O (all plans) rc=$?"; grep -E "^ *70B" $S/sweep-o.log | cut -c1-220; el sweep
pack; rm -rf $S; ls $OUT
