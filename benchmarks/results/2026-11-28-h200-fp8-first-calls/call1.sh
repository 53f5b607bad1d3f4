#!/usr/bin/env bash
# Session 13 call 1 (fresh machine, TP = every GPU): install; the fp8 cuBLASLt refusal test and the
# cuBLASLt/table GEMM tests at once on GPUs 0 and 1; the plan test; --calibrate at TP = every GPU
# and at TP=2 (default scope all, so steps_by_table); the quick sweep under all (A) and one-rank (B).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { cp -r ~/.cache/distgemm/machines $S/ 2>/dev/null; (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
git log -1 --format=%h | tee $S/commit.txt
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed; }
python3 -c 'from distgemm import _core as c; print("cuda_runtime", c.cuda_runtime, "cublaslt", repr(c.cublaslt_problem()), c.cublaslt_version())'
pack
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -rs tests/gpu/test_kernel_fp8.py -k cublaslt > $S/fp8-tests.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m pytest -q -rs tests/gpu/test_kernel_gemm.py -k "cublaslt or kernel_table" > $S/kernel-tests.log 2>&1 &
wait
echo "== fp8"; tail -3 $S/fp8-tests.log; echo "== kernel"; tail -3 $S/kernel-tests.log; el tests
DISTGEMM_TEST_TP=$NG DISTGEMM_TEST_RESULTS=$S/results timeout 150 python3 -m pytest -q -rs tests/gpu/test_cublaslt_plans.py > $S/plans-tests.log 2>&1
echo "plans tests rc=$?"; tail -3 $S/plans-tests.log; el plans-tests
pack
timeout 100 torchrun --nproc-per-node $NG -m distgemm.tune --calibrate > $S/cal-tp$NG.log 2>&1
echo "calibrate tp$NG rc=$?"; tail -4 $S/cal-tp$NG.log | cut -c1-200; el cal
CUDA_VISIBLE_DEVICES=0,1 timeout 100 torchrun --nproc-per-node 2 -m distgemm.tune --calibrate > $S/cal-tp2.log 2>&1
echo "calibrate tp2 rc=$?"; tail -4 $S/cal-tp2.log | cut -c1-200; el cal2
pack
run() {  # label, plans scope
  DISTGEMM_KERNEL_TABLE_PLANS=$2 timeout 150 torchrun --nproc-per-node $NG -m benchmarks.sweep.llama_sweep --quick --out $S/sweep-$1 > $S/sweep-$1.log 2>&1
  echo "sweep $1 ($2) rc=$?"; el "sweep $1"; pack
}
run A all
run B one-rank
for l in A B; do echo "== $l"; grep -E "^ *70B" $S/sweep-$l.log | cut -c1-200 | head -8; done
pack; rm -rf $S; ls $OUT
