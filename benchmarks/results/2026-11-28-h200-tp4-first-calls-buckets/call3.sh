#!/usr/bin/env bash
# Session 15 call 3 (fresh machine, TP = every GPU): install with row buckets off by default (the
# heuristic per row count); cuBLASLt/table GEMM tests (both bucket settings) on GPU 0; first calls
# at TP = every GPU and TP = 2 under the default, then under DISTGEMM_CUBLASLT_ROW_BUCKETS=on;
# the Llama sweep at TP = every GPU (70B, 405B x 4096, 8192 tokens) under the shipped table.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -q -rs tests/gpu/test_kernel_gemm.py -k "cublaslt or kernel_table" > $S/kernel-tests.log 2>&1
echo "kernel tests rc=$?"; tail -2 $S/kernel-tests.log; el kernel-tests
OUT=$S bash benchmarks/run_on_gpus.sh first-calls > $S/parts2.log 2>&1; tail -1 $S/parts2.log
grep -E "first call ms|graph  |heuristic  |preload  " $S/first-calls.log | cut -c1-140; el first-calls; pack
mkdir -p $S/first-calls-buckets
for tp in $NG 2; do
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((tp - 1))) DISTGEMM_CUBLASLT_ROW_BUCKETS=on timeout 100 torchrun --nproc-per-node $tp \
    -m benchmarks.host.first_call --phases --out $S/first-calls-buckets/tp$tp-all.json > $S/first-calls-buckets/tp$tp.log 2>&1
  grep -E "first call ms|graph  |heuristic  " $S/first-calls-buckets/tp$tp.log | cut -c1-140
done; el first-calls-buckets; pack
SWEEP_S=330 SWEEP_ARGS="--models 70B,405B --tokens 4096,8192" OUT=$S bash benchmarks/run_on_gpus.sh sweep-full > $S/parts3.log 2>&1
grep "rc=" $S/parts3.log; el sweep; pack
pack; rm -rf $S; ls $OUT
