#!/usr/bin/env bash
# Session 9 call 3 (4 GPUs): install; decode at TP=4 under the shipped constants (this commit's
# H100 TP=4 file): 8B, 70B, 405B O at 1..256 tokens (27 points), two_shot_pull forced too.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W11\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed; }
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this call)'
pack
timeout 420 torchrun --nproc-per-node 4 -m benchmarks.decode.decode_layers --models 8B,70B,405B --layers O --extra none --own-all-reduce two_shot_pull --out $S/decode4 > $S/decode-tp4.log 2>&1
echo "decode tp4 rc=$?"; f $S/decode-tp4.log | grep -v "^\[" | grep "^8B\|^70B\|^405B\|median\|minimum\|mm alone" | cut -c1-330; el decode4
pack; rm -rf $S; ls $OUT
