#!/usr/bin/env bash
# H200 kernel table, part 2 of 3 (warm): the TP=4 and TP=8 local GEMMs (120
# shapes) measured as H100's table was (model's pick, cuBLASLt ranks 0 and 1, table off), split
# over every GPU; the tables kept in /tmp/kt (the warm machine keeps them) and returned.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S /tmp/kt
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { cp /tmp/kt/* $S/ 2>/dev/null; (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed; }
measure() {  # label, kernel_vs_cublas filters
  local label=$1; shift
  N=$(python3 -m benchmarks.kernel.kernel_vs_cublas "$@" --local-only --dry-run | tail -1 | cut -d' ' -f1)
  PER=$(( (N + NG - 1) / NG )); echo "$label: $N shapes, $PER per GPU"
  for i in $(seq 0 $((NG - 1))); do
    CUDA_VISIBLE_DEVICES=$i timeout 560 python3 -m benchmarks.kernel.kernel_vs_cublas "$@" --local-only \
      --configs "" --cublas-algos 2 --kernel-table off --skip $((PER * i)) --limit $PER --budget-s 520 \
      --out /tmp/kt --stem $label-$i --table /tmp/kt/table-$label-$i.json > $S/$label-$i.log 2>&1 &
  done
  wait; el "$label measured"; tail -n 2 $S/$label-*.log | cut -c1-200
}
measure tp48 --tp 4,8
parts=$(ls /tmp/kt/table-*.json); python3 -m benchmarks.kernel.kernel_vs_cublas --merge $parts --table /tmp/kt/table.json
pack; rm -rf $S; ls $OUT
