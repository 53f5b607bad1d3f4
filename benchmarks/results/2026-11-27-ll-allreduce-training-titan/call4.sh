#!/usr/bin/env bash
# Session 4 call 4 (2 GPUs): install; torchtitan at TP=2 with the switch on under torch's default
# automatic dynamic shapes (the stride fix), then off; losses compared at --lr 3e-5.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S $S/titan
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W1127\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this run)'
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/titan-site .whl/titan/*.whl
for s in on off; do
  PYTHONPATH=/tmp/titan-site TORCH_LOGS=recompiles timeout $(( 190 - $(date +%s) + t0 )) torchrun --nproc-per-node 2 -m benchmarks.training.titan_async_tp --switch $s --out $S/titan/tp2-$s.json > $S/titan-$s.log 2>&1
  echo "titan $s rc=$?"; grep -i "Error" $S/titan-$s.log | head -3 | cut -c1-300; f $S/titan-$s.log | grep -v micro_pipeline | grep "tokens/s" ; el titan $s
done
python3 -m benchmarks.training.titan_compare $S/titan/tp2-off.json $S/titan/tp2-on.json 2>&1 | tail -5
cd $OUT && tar czf a.tgz s && rm -rf s
