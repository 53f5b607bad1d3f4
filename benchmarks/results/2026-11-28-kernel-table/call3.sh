#!/usr/bin/env bash
# Session 10 call 3 (4 GPUs): install; the plans with cuBLASLt steps at TP=4 (after the peer-
# operand rule); then the Llama sweep's quick cases at TP=4 with the shipped kernel table (A), with
# DISTGEMM_KERNEL_TABLE=off (B, the kernels before this session), and with the table again (A).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | head -1
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed; }
pack
DISTGEMM_TEST_TP=4 DISTGEMM_TEST_RESULTS=$S/results timeout 100 python3 -m pytest -q -rs tests/gpu/test_cublaslt_plans.py > $S/plans-tests.log 2>&1
echo "plans tests rc=$?"; tail -2 $S/plans-tests.log; el plans-tests
pack
run() {  # label, then env assignments
  local label=$1; shift
  env "$@" timeout 170 torchrun --nproc-per-node 4 -m benchmarks.sweep.llama_sweep --quick --out $S/sweep-$label > $S/sweep-$label.log 2>&1
  echo "sweep $label rc=$?"; el "sweep $label"; pack
}
run A1 DISTGEMM_KERNEL_TABLE=
run B DISTGEMM_KERNEL_TABLE=off
run A2 DISTGEMM_KERNEL_TABLE=
for l in A1 B A2; do echo "== $l"; grep -E "^ *70B" $S/sweep-$l.log | cut -c1-200 | head -8; done
pack; rm -rf $S; ls $OUT
