#!/usr/bin/env bash
# Session 19 call 7 (one GPU, fresh machine): the README's install, then probes.cublaslt_workspace
# on 20 of call 3's TP=8 shapes where the table runs cuBLASLt (its 16 highest ratios over
# torch.mm and its 4 lowest): cuBLASLt rank 0 without and with a 32 MiB workspace vs torch.mm.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts.log 2>&1; grep "==" $S/parts.log
timeout 150 python3 -m benchmarks.probes.cublaslt_workspace --shapes 8192x7168x8192,4096x7168x8192,2048x2304x16384,1024x2304x16384,2048x3584x4096,2048x768x4096,1024x4096x1792,1024x3584x4096,1024x8192x3584,1024x13312x16384,16384x3584x4096,4096x8192x3584,2048x1280x8192,2048x4096x512,4096x1280x8192,4096x2304x16384,8192x8192x3584,4096x16384x2048,16384x8192x1024,4096x4096x512 2>&1 | tee $S/probe.txt
(cd $OUT && tar czf a.tgz s)
