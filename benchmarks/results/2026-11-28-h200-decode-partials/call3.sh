#!/usr/bin/env bash
# Session 18 call 3 (TP = every GPU, warm): install; issue 42 decode grid on 405B
# 70B (O, FC2 at 1..256 tokens) under the shipped file.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
cp $S/env.txt $S/env-install.txt; pack
DECODE_S=260 DECODE_ARGS="--models 405B --extra none" OUT=$S bash benchmarks/run_on_gpus.sh decode > $S/parts2.log 2>&1; tail -1 $S/parts2.log
grep -E "auto |median|minimum|mm alone" $S/decode.log | cut -c1-150 | head -45; el decode
pack; rm -rf $S; ls $OUT
