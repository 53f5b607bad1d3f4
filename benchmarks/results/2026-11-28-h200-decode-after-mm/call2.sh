#!/usr/bin/env bash
# Session 17 call 2 (fresh machine, TP = every GPU): install; issue 43's training step at TP =
# every GPU (Llama-70B MLP block fwd+bwd: distgemm vs torch async-TP vs megatron vs the floors).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
cp $S/env.txt $S/env-install.txt
TRAINING_S=400 OUT=$S bash benchmarks/run_on_gpus.sh training > $S/parts2.log 2>&1; tail -1 $S/parts2.log
grep -v micro_pipeline $S/training.log | tail -24 | cut -c1-200; el training
pack; rm -rf $S; ls $OUT
