#!/usr/bin/env bash
# Session 19 call 1 (one GPU, fresh machine): the README's install, then decode.fused_tp1 in the
# same run_on_gpus.sh invocation (INSTALLED_BY set): its correctness checks (the fused path, and
# the collective path's torch.mm + NCCL at TP=1 against torch.mm's bits), and torch.mm against
# the fused kernel at TP=1 with cold weights on the first half of the decode shape grid.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
# Llama-3 8B, 70B, 405B O and FC2 at TP 2, 4, 8 (N x K/TP), first half
SHAPES=4096x2048,4096x1024,4096x512,4096x7168,4096x3584,4096x1792,8192x4096,8192x2048,8192x1024,8192x14336,8192x7168,8192x3584
FUSED_TP1_S=330 FUSED_TP1_ARGS="--tokens 1,16,64 --layers= --shapes $SHAPES" OUT=$S \
  bash benchmarks/run_on_gpus.sh install fused-tp1 > $S/parts.log 2>&1
grep "==" $S/parts.log
cat $S/fused-tp1.log | cut -c1-160 | tail -60
pack; rm -rf $S; ls $OUT
