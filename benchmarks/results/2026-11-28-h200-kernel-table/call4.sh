#!/usr/bin/env bash
# H200 kernel table, part 3 of 3 (warm): issue 44's acceptance with the merged table
# (DISTGEMM_KERNEL_TABLE=/tmp/kt/table.json): the 180 local GEMMs, the table's choice against
# torch.mm, split over every GPU; the parts replotted as one run.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S/acc
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
test -f /tmp/kt/table.json || { echo "no /tmp/kt/table.json: parts 1 and 2 did not run on this machine"; exit 3; }
PER=$(( (180 + NG - 1) / NG ))
for i in $(seq 0 $((NG - 1))); do
  CUDA_VISIBLE_DEVICES=$i timeout 560 python3 -m benchmarks.kernel.kernel_vs_cublas --tp 2,4,8 --local-only \
    --configs "" --kernel-table /tmp/kt/table.json --skip $((PER * i)) --limit $PER --budget-s 520 \
    --out $S/acc --stem acc-$i > $S/acc-$i.log 2>&1 &
done
wait; el measured
python3 -m benchmarks.kernel.kernel_vs_cublas --replot $(ls $S/acc/acc-*.json) --out $S/acc --stem acceptance | tail -12
pack; rm -rf $S; ls $OUT
