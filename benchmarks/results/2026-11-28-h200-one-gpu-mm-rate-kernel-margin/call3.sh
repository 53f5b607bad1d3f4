#!/usr/bin/env bash
# Session 19 call 3 (one GPU, fresh machine): the README's install, then issue 44's bf16
# acceptance on TP=8's local GEMMs (kernel_vs_cublas --tp 8 --local-only --configs ""
# --kernel-table shipped: the shipped H200 table's choice against torch.mm), in one
# run_on_gpus.sh invocation (INSTALLED_BY set).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
KERNEL_S=400 KERNEL_ARGS='--tp 8 --local-only --configs= --kernel-table shipped' OUT=$S \
  bash benchmarks/run_on_gpus.sh install kernel-vs-cublas > $S/parts.log 2>&1
grep "==" $S/parts.log
tail -25 $S/kernel-vs-cublas.log | cut -c1-170
pack; rm -rf $S; ls $OUT
