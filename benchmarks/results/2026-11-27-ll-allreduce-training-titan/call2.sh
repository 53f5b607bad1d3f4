#!/usr/bin/env bash
# Session 4 call 2 (4 GPUs): install; training_step at TP=4 (issue 43 acceptance); torchtitan's
# Llama-3 at TP=4 with async-TP, distgemm's switch off then on (issue 43 item 3).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S $S/titan
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W1127\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this run)'
timeout 250 torchrun --nproc-per-node 4 -m benchmarks.training.training_step --out $S/training > $S/training.log 2>&1
echo "training rc=$?"; f $S/training.log | tail -22 | cut -c1-200; el training
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/titan-site .whl/titan/*.whl
export PYTHONPATH=/tmp/titan-site${PYTHONPATH:+:$PYTHONPATH}
for s in off on; do
  [ $s = off ] && left=$(( (585 - $(date +%s) + t0) / 2 )) || left=$(( 585 - $(date +%s) + t0 ))
  timeout $left torchrun --nproc-per-node 4 -m benchmarks.training.titan_async_tp --switch $s --out $S/titan/tp4-$s.json > $S/titan-$s.log 2>&1
  echo "titan $s rc=$?"; f $S/titan-$s.log | tail -8 | cut -c1-250; el titan $s
done
python3 -m benchmarks.training.titan_compare $S/titan/tp4-off.json $S/titan/tp4-on.json 2>&1 | tail -15
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
