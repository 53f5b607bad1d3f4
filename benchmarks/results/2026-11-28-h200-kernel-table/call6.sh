#!/usr/bin/env bash
# As it ran (the `--kernel-table /tmp/kt/table.json` below, call 3's H200 table, was added by sed on the machine).
# Session 12 call 3 (warm): the shipped table on shapes it did not measure: kernel_vs_cublas on
# the step-only shapes (--skip 180: 108 of them), the table's choice (rows, else its default) against
# torch.mm, the list split over every GPU at once.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S/gen
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
python3 -c 'import distgemm' || exit 3
N=$(python3 -m benchmarks.kernel.kernel_vs_cublas --tp 2,4,8 --configs "" --skip 180 --dry-run | tail -1 | cut -d' ' -f1)
PER=$(( (N + NG - 1) / NG )); echo "$N shapes, $PER per GPU"
for i in $(seq 0 $((NG - 1))); do
  CUDA_VISIBLE_DEVICES=$i timeout 560 python3 -m benchmarks.kernel.kernel_vs_cublas --tp 2,4,8 \
    --configs "" --kernel-table /tmp/kt/table.json --skip $((180 + PER * i)) --limit $PER --budget-s 530 \
    --out $S/gen --stem gen-$i > $S/gen-$i.log 2>&1 &
done
wait; el measured
parts=$(ls $S/gen/gen-*.json)
python3 -m benchmarks.kernel.kernel_vs_cublas --replot $parts --out $S/gen --stem generalization | tail -12
pack; rm -rf $S; ls $OUT
