#!/usr/bin/env bash
# Session 17 call 5 (fresh machine, TP = every GPU): install; the decode calibration (--reduce-only:
# each all-reduce timed right after its torch.mm) at TP = every GPU.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S/calibrate
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
cp $S/env.txt $S/env-install.txt; pack
NP=$(nvidia-smi -L | wc -l)
timeout 90 torchrun --nproc-per-node $NP -m distgemm.tune --calibrate --reduce-only \
  --out $S/calibrate/tp$NP-reduce.json > $S/calibrate.log 2>&1; echo "calibrate rc $?"
grep -v "^W1128\|\*\*\*\*" $S/calibrate.log | tail -12 | cut -c1-200; el calibrated
pack; rm -rf $S; ls $OUT
