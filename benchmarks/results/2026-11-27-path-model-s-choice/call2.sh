#!/usr/bin/env bash
# Session 7 call 2 (4 GPUs): install; training_step at TP=4 and TP=2 under the shipped constants
# (this session's H100 calibration, refitted); the Llama sweep at TP=4 (70B, 405B x 4096, 8192)
# and TP=2 (70B x 4096, 8192): the public op's choice on shapes the calibration did not run.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W11\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed; }
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this call)'
timeout 120 torchrun --nproc-per-node 4 -m benchmarks.training.training_step --out $S/training4 > $S/training4.log 2>&1
echo "training tp4 rc=$?"; f $S/training4.log | grep -v micro_pipeline | tail -20 | cut -c1-160; el training4
CUDA_VISIBLE_DEVICES=0,1 timeout 120 torchrun --nproc-per-node 2 -m benchmarks.training.training_step --out $S/training2 > $S/training2.log 2>&1
echo "training tp2 rc=$?"; f $S/training2.log | grep -v micro_pipeline | tail -20 | cut -c1-160; el training2
timeout 200 torchrun --nproc-per-node 4 -m benchmarks.sweep.llama_sweep --models 70B,405B --tokens 4096,8192 --out $S/sweep4 > $S/sweep4.log 2>&1
echo "sweep tp4 rc=$?"; f $S/sweep4.log | tail -24 | cut -c1-220; el sweep4
CUDA_VISIBLE_DEVICES=0,1 timeout 110 torchrun --nproc-per-node 2 -m benchmarks.sweep.llama_sweep --models 70B --tokens 4096,8192 --out $S/sweep2 > $S/sweep2.log 2>&1
echo "sweep tp2 rc=$?"; f $S/sweep2.log | tail -14 | cut -c1-220; el sweep2
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
