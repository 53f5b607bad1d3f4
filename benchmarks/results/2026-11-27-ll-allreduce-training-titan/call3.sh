#!/usr/bin/env bash
# Session 4 call 3 (2 GPUs): install; calibration at TP=2 (full on H200, decode terms on H100);
# training_step at TP=2; torchtitan at TP=2 switch off/on (recompile reasons logged); a TP=2 decode
# subset under the new calibration with our all-reduces forced too.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S $S/titan /tmp/dg/cal
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W1127\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this run)'
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $gpu"
if echo "$gpu" | grep -q H200; then cal="--calibrate"; else cal="--calibrate --reduce-only"; fi
timeout 120 torchrun --nproc-per-node 2 -m distgemm.tune $cal --out /tmp/dg/cal/tp2.json > $S/cal2.log 2>&1
f $S/cal2.log | tail -14; cp /tmp/dg/cal/tp2.json $S/cal-tp2.json; el calibrated
export DISTGEMM_CALIBRATION=/tmp/dg/cal/tp2.json
timeout 150 torchrun --nproc-per-node 2 -m benchmarks.training.training_step --out $S/training > $S/training.log 2>&1
echo "training rc=$?"; f $S/training.log | grep -v micro_pipeline | tail -18 | cut -c1-200; el training
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/titan-site .whl/titan/*.whl
for s in off on; do
  PYTHONPATH=/tmp/titan-site TORCH_LOGS=recompiles timeout 110 torchrun --nproc-per-node 2 -m benchmarks.training.titan_async_tp --switch $s --out $S/titan/tp2-$s.json > $S/titan-$s.log 2>&1
  echo "titan $s rc=$?"; grep -i "recompil" $S/titan-$s.log | head -4 | cut -c1-400; f $S/titan-$s.log | grep -v micro_pipeline | tail -4 | cut -c1-250; el titan $s
done
python3 -m benchmarks.training.titan_compare $S/titan/tp2-off.json $S/titan/tp2-on.json 2>&1 | tail -12
left=$(( 565 - $(date +%s) + t0 ))
timeout $left torchrun --nproc-per-node 2 -m benchmarks.decode.decode_layers \
  --models 70B,405B --layers O,FC2 --tokens 1,8,32,128 --extra none --own-all-reduce --out $S/dec2 > $S/dec2.log 2>&1
f $S/dec2.log | grep "acceptance\|median\|minimum\|mm alone" | cut -c1-220 | head; el decode
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
