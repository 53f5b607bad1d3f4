#!/usr/bin/env bash
# Next session call 3 (4 GPUs, warm: call 1's install), on the branch with h-host and h-fp8step
# merged: training_step at TP=4 with --profile (the bf16 and fp8 variants, per-kernel tables),
# tests/gpu/test_training.py at TP=4, then training_step at TP=2 on GPUs 0-1.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W11\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
python3 -c 'import distgemm' || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; el reinstalled; }
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (call 1 on this machine)'
timeout 260 torchrun --nproc-per-node 4 -m benchmarks.training.training_step --profile --out $S/training4 > $S/training4.log 2>&1
echo "training tp4 rc=$?"; f $S/training4.log | grep -v micro_pipeline | tail -24 | cut -c1-200; el training4
OUT=$S GPU_TESTS="training" GPU_TEST_S=120 bash benchmarks/run_on_gpus.sh gpu-tests > $S/parts2.log 2>&1
grep "== test_\|passed\|failed\|error" $S/parts2.log | head; el test_training
CUDA_VISIBLE_DEVICES=0,1 timeout 180 torchrun --nproc-per-node 2 -m benchmarks.training.training_step --out $S/training2 > $S/training2.log 2>&1
echo "training tp2 rc=$?"; f $S/training2.log | grep -v micro_pipeline | tail -16 | cut -c1-200; el training2
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
