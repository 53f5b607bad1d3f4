#!/usr/bin/env bash
# Session 13 call 2 (warm): the fp8 kernel table's tensor-wise rows (ours_fp8 against cublaslt_fp8,
# scaled_mm the baseline), 180 local shapes of TP 2, 4, 8 split over the GPUs; merged with the
# shipped bf16 table into /tmp/kt8/table.json.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S /tmp/kt8
export PYTHONUNBUFFERED=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -c 'import distgemm' || exit 3
F="--models 8B,70B,405B --tp 2,4,8 --tokens 1024,2048,4096,8192,16384 --scales tensor"
N=$(python3 -m benchmarks.fp8.fp8_kernel_vs_scaled_mm $F --dry-run | tail -1 | cut -d' ' -f1)
PER=$(( (N + NG - 1) / NG )); echo "$N shapes, $PER per GPU"
for i in $(seq 0 $((NG - 1))); do
  CUDA_VISIBLE_DEVICES=$i timeout 400 python3 -m benchmarks.fp8.fp8_kernel_vs_scaled_mm $F --cublas \
    --variants ours_fp8,cublaslt_fp8 --kernel-table off --skip $((PER * i)) --limit $PER --budget-s 360 \
    --out /tmp/kt8 --stem fp8t-$i --table /tmp/kt8/table-$i.json > $S/fp8t-$i.log 2>&1 &
done
wait; el measured; tail -n 2 $S/fp8t-*.log | cut -c1-200
SHIPPED=$(python3 -c 'import distgemm, pathlib; print(pathlib.Path(distgemm.__file__).parent / "data/kernels/nvidia-h200.json")')
python3 -m benchmarks.kernel.kernel_vs_cublas --merge $SHIPPED /tmp/kt8/table-*.json --table /tmp/kt8/table.json | tail -3
cp /tmp/kt8/* $S/; (cd $OUT && tar czf a.tgz s); rm -rf $S; ls $OUT
