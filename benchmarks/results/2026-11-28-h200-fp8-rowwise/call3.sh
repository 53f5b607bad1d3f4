#!/usr/bin/env bash
# Session 14 call 3 (warm): issue 44's fp8 row-wise acceptance, 180 local shapes of TP 2, 4, 8 split
# over the 2 GPUs (90 each), with call 2's merged table (the shipped H200 table + row-wise rows).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S/acc
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
test -f /tmp/kt8/table.json || { echo "no /tmp/kt8/table.json"; exit 3; }
F="--models 8B,70B,405B --tp 2,4,8 --tokens 1024,2048,4096,8192,16384 --scales row"
for i in 0 1; do
  CUDA_VISIBLE_DEVICES=$i timeout 555 python3 -m benchmarks.fp8.fp8_kernel_vs_scaled_mm $F \
    --variants ours_fp8 --kernel-table /tmp/kt8/table.json --skip $((90 * i)) --limit 90 \
    --budget-s 520 --out $S/acc --stem acc-row-$i > $S/acc-row-$i.log 2>&1 &
done
wait; el "row measured"; tail -n 2 $S/acc-row-*.log | cut -c1-150
(cd $OUT && tar czf a.tgz s); rm -rf $S; ls $OUT
