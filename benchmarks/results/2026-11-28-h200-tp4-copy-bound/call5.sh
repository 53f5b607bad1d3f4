#!/usr/bin/env bash
# Session 16 call 5 (fresh machine, TP = every GPU): install with two copy lanes by default; the
# GPU tests of every schedule's plans (fused, capture); then the reduce-scatter layers of the
# Llama sweep (70B, 405B x O, FC2 x 4096, 8192) under DISTGEMM_COPY_LANES=2, then =1, one machine.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
cp $S/env.txt $S/env-install.txt
GPU_TESTS="fused capture" GPU_TESTS_S=200 OUT=$S bash benchmarks/run_on_gpus.sh gpu-tests > $S/parts2.log 2>&1
grep -E "rc=|passed|failed" $S/parts2.log | head -8; el gpu-tests; pack
for lanes in 2 1; do
  DISTGEMM_COPY_LANES=$lanes timeout 150 torchrun --nproc-per-node $NG -m benchmarks.sweep.llama_sweep --models 70B,405B \
    --layers O,FC2 --tokens 4096,8192 --out $S/sweep-lanes$lanes > $S/sweep-lanes$lanes.log 2>&1
  echo "== lanes $lanes rc=$?"; grep -E "^(70B|405B)/" $S/sweep-lanes$lanes.log | cut -c1-200; el "lanes $lanes"; pack
done
pack; rm -rf $S; ls $OUT
