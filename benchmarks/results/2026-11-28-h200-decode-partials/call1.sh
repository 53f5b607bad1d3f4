#!/usr/bin/env bash
# Session 18 call 1 (fresh machine, TP = every GPU): install; the GPU tests of the collective
# path's pair (dadfb0d) and of the chained all-reduce (cc3acae); probes.allreduce_chain (chained
# vs not, A B A); the decode calibration (--reduce-only) with the chained all-reduce.
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
GPU_TESTS="allreduce_kernel fused" GPU_TEST_S=200 OUT=$S bash benchmarks/run_on_gpus.sh gpu-tests > $S/parts2.log 2>&1
grep -E "rc=|passed|failed" $S/parts2.log | head -12; el gpu-tests; pack
timeout 150 torchrun --nproc-per-node $NP -m benchmarks.probes.allreduce_chain --models 8B,70B,405B \
  --layers O --tokens 1,16,128 --out $S/chain-tp$NP.json > $S/chain.log 2>&1; echo "chain rc $?"
grep -v "^W1128\|\*\*\*\*" $S/chain.log | tail -22 | cut -c1-200; el chain; pack
timeout 150 torchrun --nproc-per-node $NP -m distgemm.tune --calibrate --reduce-only \
  --out $S/calibrate/tp$NP-reduce.json > $S/calibrate.log 2>&1; echo "calibrate rc $?"
grep -v "^W1128\|\*\*\*\*" $S/calibrate.log | tail -14 | cut -c1-200; el calibrated
pack; rm -rf $S; ls $OUT
