#!/usr/bin/env bash
# Next session call 2 (4 GPUs, warm: call 1's install): the compat-ops probe with 4 and 1 operand
# sets (retargets and direct launches per call, cProfile of the host time); first calls of 96
# token counts (issue 41's median); torchtitan TP=4 off/on.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S $S/titan
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W11\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 -c 'import distgemm' || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; el reinstalled; }
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (call 1 on this machine)'
for L in 4 1; do
  timeout 150 torchrun --nproc-per-node 4 -m benchmarks.probes.compat_ops --layers $L --out $S/compat-l$L > $S/compat-l$L.log 2>&1
  echo "probe L=$L rc=$?"; f $S/compat-l$L.log | grep -v "^\[rank" | grep -A40 "^op " | cut -c1-200 | head -60; el probe $L
done
timeout 120 torchrun --nproc-per-node 4 -m benchmarks.host.first_call --out $S/first-call-tp4.json > $S/first-call.log 2>&1
echo "first_call rc=$?"; f $S/first-call.log | grep -v "^\[rank" | tail -14 | cut -c1-200; el first_call
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/titan-site .whl/titan/*.whl
for s in off on; do
  PYTHONPATH=/tmp/titan-site timeout 100 torchrun --nproc-per-node 4 -m benchmarks.training.titan_async_tp --switch $s --out $S/titan/tp4-$s.json > $S/titan-$s.log 2>&1
  echo "titan $s rc=$?"; f $S/titan-$s.log | grep "Error\|tokens/s" | head -3 | cut -c1-250; el titan $s
done
python3 -m benchmarks.training.titan_compare $S/titan/tp4-off.json $S/titan/tp4-on.json 2>&1 | tail -4
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
