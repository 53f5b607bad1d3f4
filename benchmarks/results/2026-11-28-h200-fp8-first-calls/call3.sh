#!/usr/bin/env bash
# Session 13 call 3 (warm): issue 44's fp8 acceptance, 180 local shapes of TP 2, 4, 8 split over the
# GPUs: tensor-wise scales with call 2's merged table, then row-wise (no cuBLASLt algorithm: the
# distgemm kernel serves every shape).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S/acc
export PYTHONUNBUFFERED=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
test -f /tmp/kt8/table.json || { echo "no /tmp/kt8/table.json"; exit 3; }
acc() {  # scales
  F="--models 8B,70B,405B --tp 2,4,8 --tokens 1024,2048,4096,8192,16384 --scales $1"
  PER=45
  for i in $(seq 0 $((NG - 1))); do
    CUDA_VISIBLE_DEVICES=$i timeout 290 python3 -m benchmarks.fp8.fp8_kernel_vs_scaled_mm $F \
      --variants ours_fp8 --kernel-table /tmp/kt8/table.json --skip $((PER * i)) --limit $PER \
      --budget-s 265 --out $S/acc --stem acc-$1-$i > $S/acc-$1-$i.log 2>&1 &
  done
  wait; el "$1 measured"; (cd $OUT && tar czf a.tgz s)
}
acc tensor
acc row
(cd $OUT && tar czf a.tgz s); rm -rf $S; ls $OUT
