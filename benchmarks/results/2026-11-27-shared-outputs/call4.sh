#!/usr/bin/env bash
# Session 9 call 4 (2 GPUs: no 4-GPU machine could be started): install; the chunked GEMM + all-reduce probe at TP=2.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed; }
pack
timeout 175 torchrun --nproc-per-node 4 -m benchmarks.probes.chunked_allreduce --out $S/chunked-tp4.json > $S/chunked-tp4.log 2>&1
echo "probe rc=$?"; grep -v "^W11\|\*\*\*\*\|OMP_NUM\|^\s*$" $S/chunked-tp4.log | tail -16 | cut -c1-250; el probe
pack; rm -rf $S; ls $OUT
