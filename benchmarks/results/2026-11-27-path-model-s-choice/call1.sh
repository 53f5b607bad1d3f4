#!/usr/bin/env bash
# Session 7 call 1 (4 GPUs): install; calibrate TP=4 and TP=2 (nonnegative fit, warmed runs,
# large shapes); training_step at TP=4 and TP=2 under those constants (model-chosen S).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S/cal
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W11\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed; }
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this call)'
export DISTGEMM_CALIBRATION=$S/cal
timeout 150 torchrun --nproc-per-node 4 -m distgemm.tune --calibrate > $S/cal-tp4.log 2>&1
echo "cal tp4 rc=$?"; f $S/cal-tp4.log | tail -30 | cut -c1-160; el cal4
CUDA_VISIBLE_DEVICES=0,1 timeout 150 torchrun --nproc-per-node 2 -m distgemm.tune --calibrate > $S/cal-tp2.log 2>&1
echo "cal tp2 rc=$?"; f $S/cal-tp2.log | tail -24 | cut -c1-160; el cal2
ls $S/cal
timeout 150 torchrun --nproc-per-node 4 -m benchmarks.training.training_step --out $S/training4 > $S/training4.log 2>&1
echo "training tp4 rc=$?"; f $S/training4.log | grep -v micro_pipeline | tail -22 | cut -c1-200; el training4
CUDA_VISIBLE_DEVICES=0,1 timeout 150 torchrun --nproc-per-node 2 -m benchmarks.training.training_step --out $S/training2 > $S/training2.log 2>&1
echo "training tp2 rc=$?"; f $S/training2.log | grep -v micro_pipeline | tail -22 | cut -c1-200; el training2
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
