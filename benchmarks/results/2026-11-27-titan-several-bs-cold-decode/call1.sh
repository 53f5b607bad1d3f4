#!/usr/bin/env bash
# Session 5 call 1 (4 GPUs): install; GPU tests of the two merged branches (h-ar-ilp: our two-shot
# all-reduces issue every peer's loads first; h-fused2: the CUTLASS fused kernel's two-shot tail);
# torchtitan at TP=4 with async-TP, distgemm's switch off then on (stride fix + gather rewrite).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S $S/titan
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W1127\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this run)'
OUT=$S GPU_TESTS="allreduce_kernel fused" GPU_TEST_S=140 bash benchmarks/run_on_gpus.sh gpu-tests > $S/parts2.log 2>&1
grep "== test_\|passed\|failed\|error" $S/parts2.log | head -20; el gpu-tests
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/titan-site .whl/titan/*.whl
for s in off on; do
  [ $s = off ] && left=$(( (590 - $(date +%s) + t0) / 2 )) || left=$(( 590 - $(date +%s) + t0 ))
  PYTHONPATH=/tmp/titan-site timeout $left torchrun --nproc-per-node 4 -m benchmarks.training.titan_async_tp --switch $s --out $S/titan/tp4-$s.json > $S/titan-$s.log 2>&1
  echo "titan $s rc=$?"; grep -i "Error" $S/titan-$s.log | head -3 | cut -c1-300; f $S/titan-$s.log | grep -v micro_pipeline | tail -5 | cut -c1-250; el titan $s
done
python3 -m benchmarks.training.titan_compare $S/titan/tp4-off.json $S/titan/tp4-on.json 2>&1 | tail -12
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
