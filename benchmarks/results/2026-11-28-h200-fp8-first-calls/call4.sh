#!/usr/bin/env bash
# Session 13 call 4 (warm): the per-stream timeline of 70B O and QKV at 4096 tokens, TP = every GPU, S = 2 TP.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
NG=$(nvidia-smi -L | wc -l)
timeout 240 torchrun --nproc-per-node $NG -m benchmarks.timeline.overlap_timeline --model 70B --layer O,QKV --tokens 4096 --steps $((2 * NG)) --out $S > $S/timeline.log 2>&1
echo rc=$?; grep -v "^W1128" $S/timeline.log | tail -40 | cut -c1-220
(cd $OUT && tar czf a.tgz s); rm -rf $S; ls $OUT
