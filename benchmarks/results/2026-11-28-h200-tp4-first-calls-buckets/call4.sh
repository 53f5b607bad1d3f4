#!/usr/bin/env bash
# Session 15 call 4 (fresh machine): install; the reduce-scatter probe (rs_probe.py (.whl/ then)) under the
# table in every plan with row buckets off (default), on, and under one-rank plans.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
for v in "all off" "all on" "one-rank off"; do set -- $v
  DISTGEMM_KERNEL_TABLE_PLANS=$1 DISTGEMM_CUBLASLT_ROW_BUCKETS=$2 timeout 150 torchrun --nproc-per-node $NG rs_probe.py (.whl/ then) > $S/probe-$1-$2.log 2>&1
  echo "== $v rc=$?"; grep -E "^table|^rank 0" $S/probe-$1-$2.log | cut -c1-260; grep "^rank [1-9].*FAIL" $S/probe-$1-$2.log | head -3 | cut -c1-200
  el "$v"; pack
done
pack; rm -rf $S; ls $OUT
