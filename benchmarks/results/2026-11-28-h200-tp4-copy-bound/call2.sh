#!/usr/bin/env bash
# Session 16 call 2 (fresh machine, TP = every GPU): install with `all` the default again (the
# kernel table in every plan); the Llama sweep at TP = every GPU (70B, 405B x 4096, 8192 tokens);
# first calls at TP = every GPU and TP = 2 under the default.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
SWEEP_S=300 SWEEP_ARGS="--models 70B,405B --tokens 4096,8192" OUT=$S bash benchmarks/run_on_gpus.sh sweep-full > $S/parts2.log 2>&1
grep "rc=" $S/parts2.log; grep -iE "fail|timed out|error" $S/sweep-full.log | head -5; el sweep; pack
mkdir -p $S/first-calls
for tp in $NG 2; do
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((tp - 1))) timeout 100 torchrun --nproc-per-node $tp \
    -m benchmarks.host.first_call --phases --out $S/first-calls/tp$tp-default.json > $S/first-calls/tp$tp.log 2>&1
  echo "== tp$tp rc=$?"; grep -E "first call ms|graph  |heuristic  |torch GEMM" $S/first-calls/tp$tp.log | cut -c1-140
done; el first-calls
pack; rm -rf $S; ls $OUT
