#!/usr/bin/env bash
# Session 13 call 7 (fresh machine): install; issue 44's fp8 tensor-wise acceptance again, with the
# baseline writing into its output (out=) and the shipped table (tensor-wise rows merged in);
# then the probe of cuBLASLt's host cost per new shape (GPU 0).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S/acc
export PYTHONUNBUFFERED=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | head -1 | tee $S/smi.txt
git log -1 --format=%h | tee $S/commit.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
F="--models 8B,70B,405B --tp 2,4,8 --tokens 1024,2048,4096,8192,16384 --scales tensor"
for i in $(seq 0 $((NG - 1))); do
  CUDA_VISIBLE_DEVICES=$i timeout 240 python3 -m benchmarks.fp8.fp8_kernel_vs_scaled_mm $F \
    --variants ours_fp8 --kernel-table shipped --skip $((45 * i)) --limit 45 \
    --budget-s 228 --out $S/acc --stem acc-tensor-$i > $S/acc-tensor-$i.log 2>&1 &
done
wait; el "tensor measured"; pack
CUDA_VISIBLE_DEVICES=0 timeout 25 python3 -m benchmarks.probes.cublaslt_host_cost $S/cublaslt-host-cost.json 2>&1 | tail -8
el probe; pack; rm -rf $S; ls $OUT
