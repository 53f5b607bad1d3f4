#!/usr/bin/env bash
# Session 17 call 1 (fresh machine, TP = every GPU): install; copy-probe (the ring's pushes back to
# back, paced, spread over peers; the SM push kernel beside cuBLASLt GEMMs with a carveout);
# calibrate at TP = every GPU and TP = 2 under the current default (records the step kernels).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
cp $S/env.txt $S/env-install.txt
OUT=$S bash benchmarks/run_on_gpus.sh copy-probe > $S/parts2.log 2>&1; tail -1 $S/parts2.log
grep -E "^==|split|^ce|^sm|^mm" $S/copy-probe.log | cut -c1-160; el copy-probe; pack
OUT=$S bash benchmarks/run_on_gpus.sh calibrate > $S/parts3.log 2>&1; tail -1 $S/parts3.log
tail -30 $S/calibrate.log | cut -c1-200; el calibrate
pack; rm -rf $S; ls $OUT
