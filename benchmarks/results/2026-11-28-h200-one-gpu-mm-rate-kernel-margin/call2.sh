#!/usr/bin/env bash
# Session 19 call 2 (one GPU, warm after call 1): the README's install again (build cache), then
# decode.fused_tp1 on the second half of the grid: 405B at TP 2, 4, 8 and a layer family that is
# not Llama's (Qwen2.5-32B: hidden 5120, FFN 27648; O and FC2 at TP 2, 4, 8), timing only.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
SHAPES=16384x8192,16384x4096,16384x2048,16384x26624,16384x13312,16384x6656,5120x2560,5120x1280,5120x640,5120x13824,5120x6912,5120x3456
FUSED_TP1_S=400 FUSED_TP1_ARGS="--skip-check --tokens 1,16,64 --layers= --shapes $SHAPES" OUT=$S \
  bash benchmarks/run_on_gpus.sh install fused-tp1 > $S/parts.log 2>&1
grep "==" $S/parts.log
cat $S/fused-tp1.log | cut -c1-160 | tail -45
pack; rm -rf $S; ls $OUT
