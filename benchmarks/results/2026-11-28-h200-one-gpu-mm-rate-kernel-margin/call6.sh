#!/usr/bin/env bash
# Session 19 call 6 (one GPU): the README's install, then probes.cublaslt_workspace on the TP=8
# shapes of call 3 above 1.02x: cuBLASLt rank 0 without and with a 32 MiB workspace vs torch.mm.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts.log 2>&1; grep "==" $S/parts.log
timeout 200 python3 -m benchmarks.probes.cublaslt_workspace 2>&1 | tee $S/probe.txt
(cd $OUT && tar czf a.tgz s)
