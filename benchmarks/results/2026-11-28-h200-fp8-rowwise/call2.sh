#!/usr/bin/env bash
# Session 14 call 2 (warm): the row-wise fp8 table's second half (parts 2 and 3 of 4), then the four
# parts merged with the shipped H200 table into /tmp/kt8/table.json.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -c 'import distgemm' || exit 3
F="--models 8B,70B,405B --tp 2,4,8 --tokens 1024,2048,4096,8192,16384 --scales row"
for i in 2 3; do
  CUDA_VISIBLE_DEVICES=$((i - 2)) timeout 420 python3 -m benchmarks.fp8.fp8_kernel_vs_scaled_mm $F --cublas \
    --variants ours_fp8,cublaslt_fp8 --kernel-table off --skip $((45 * i)) --limit 45 --budget-s 380 \
    --out /tmp/kt8 --stem fp8r-$i --table /tmp/kt8/table-$i.json > $S/fp8r-$i.log 2>&1 &
done
wait; el measured; tail -n 2 $S/fp8r-*.log | cut -c1-200
SHIPPED=$(python3 -c 'import distgemm, pathlib; print(pathlib.Path(distgemm.__file__).parent / "data/kernels/nvidia-h200.json")')
python3 -m benchmarks.kernel.kernel_vs_cublas --merge $SHIPPED /tmp/kt8/table-*.json --table /tmp/kt8/table.json | tail -3
cp /tmp/kt8/* $S/; (cd $OUT && tar czf a.tgz s); rm -rf $S; ls $OUT
