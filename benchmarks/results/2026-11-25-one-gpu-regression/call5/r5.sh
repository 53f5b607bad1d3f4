#!/usr/bin/env bash
# call 5 (one H200): README install; fp8_sweep at TP=1 (one rank) on 70B O and FC1, 8192 tokens:
# the A B A order of dg_bf16 around dg_fp8 runs and reports its two windows.
export OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
INSTALLED_BY="README install (this run)" bash benchmarks/run_on_gpus.sh install > $OUT/session.log 2>&1
INSTALLED_BY="README install (this run)" FP8_SWEEP_S=300 FP8_SWEEP_ARGS="--layers O,FC1" \
  bash benchmarks/run_on_gpus.sh fp8-sweep >> $OUT/session.log 2>&1
cp .ab/s16/r5.sh $OUT/
cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz all.tgz
