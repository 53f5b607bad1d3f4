#!/usr/bin/env bash
# As it ran: `export DISTGEMM_KERNEL_TABLE=/tmp/kt/table.json; bash .whl/l2.sh` (the H200 table of call 3).
# Session 12 call 2 (warm, TP = every GPU): the quick Llama sweep with the table for every plan
# (A), for one-rank plans only (B, the default), and for every plan again (A).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
python3 -c 'import distgemm' || exit 3
run() {  # label, plans scope
  DISTGEMM_KERNEL_TABLE_PLANS=$2 timeout 180 torchrun --nproc-per-node $NG -m benchmarks.sweep.llama_sweep --quick --out $S/sweep-$1 > $S/sweep-$1.log 2>&1
  echo "sweep $1 ($2) rc=$?"; el "sweep $1"; pack
}
run A1 all
run B one-rank
run A2 all
for l in A1 B A2; do echo "== $l"; grep -E "^ *70B" $S/sweep-$l.log | cut -c1-200 | head -8; done
pack; rm -rf $S; ls $OUT
