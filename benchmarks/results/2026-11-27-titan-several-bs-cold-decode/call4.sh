#!/usr/bin/env bash
# Session 5 call 4 (4 GPUs): install; the compat-ops probe (torchtitan's Llama-3-8B symm_mem
# fused ops: distgemm's drop-ins vs unfused NCCL + torch.matmul vs torch's fused ops) at TP=4;
# torchtitan TP=4 switch off then on with the several-Bs drop-in; the switch's GPU tests.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S $S/titan
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W1127\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this run)'
timeout 120 torchrun --nproc-per-node 4 -m benchmarks.probes.compat_ops --out $S/compat > $S/compat.log 2>&1
echo "probe rc=$?"; f $S/compat.log | grep -v "^\[rank" | tail -16 | cut -c1-230; el probe
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/titan-site .whl/titan/*.whl
for s in off on; do
  PYTHONPATH=/tmp/titan-site timeout 100 torchrun --nproc-per-node 4 -m benchmarks.training.titan_async_tp --switch $s --out $S/titan/tp4-$s.json > $S/titan-$s.log 2>&1
  echo "titan $s rc=$?"; f $S/titan-$s.log | grep -v "micro_pipeline\|pickle" | grep "Error\|tokens/s" | head -3 | cut -c1-250; el titan $s
done
python3 -m benchmarks.training.titan_compare $S/titan/tp4-off.json $S/titan/tp4-on.json 2>&1 | tail -4
left=$(( 535 - $(date +%s) + t0 ))
[ $left -gt 60 ] && DISTGEMM_TORCHRUN_TIMEOUT=$((left - 10)) timeout $left python3 -m pytest -q -rs tests/gpu/test_async_tp_switch.py > $S/switch-tests.log 2>&1
tail -3 $S/switch-tests.log; el tests
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
