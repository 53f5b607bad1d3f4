#!/usr/bin/env bash
# Session 17 call 3 (fresh machine, TP = every GPU): install; issue 42's decode at TP = every GPU
# (70B, 405B O and FC2 at 1..256 tokens against the best unfused path).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
cp $S/env.txt $S/env-install.txt
DECODE_S=420 OUT=$S bash benchmarks/run_on_gpus.sh decode > $S/parts2.log 2>&1; tail -1 $S/parts2.log
grep -E "auto|acceptance|median|minimum|mm alone" $S/decode.log | cut -c1-220 | head -30; el decode
pack; rm -rf $S; ls $OUT
