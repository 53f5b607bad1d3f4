#!/usr/bin/env bash
# Session 5 call 3 (4 GPUs, warm; TP=2 on GPUs 0 and 1): the full calibration at TP=2; torchtitan
# at TP=2 switch off then on (lr 3e-5); a TP=2 decode subset under the new calibration.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S $S/titan /tmp/dg/cal
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_VISIBLE_DEVICES=0,1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W1127\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
python3 -c "import distgemm, torch; print(distgemm.__file__, torch.__version__)" || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; el reinstalled; }
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (call 1 on this machine)'
timeout 150 torchrun --nproc-per-node 2 -m distgemm.tune --calibrate --out /tmp/dg/cal/tp2.json > $S/cal2.log 2>&1
echo "calibrate rc=$?"; f $S/cal2.log | tail -14 | cut -c1-220; cp /tmp/dg/cal/tp2.json $S/cal-tp2.json; el calibrated
[ -s /tmp/dg/cal/tp2.json ] && export DISTGEMM_CALIBRATION=/tmp/dg/cal/tp2.json
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/titan-site .whl/titan/*.whl
for s in off on; do
  PYTHONPATH=/tmp/titan-site timeout 110 torchrun --nproc-per-node 2 -m benchmarks.training.titan_async_tp --switch $s --out $S/titan/tp2-$s.json > $S/titan2-$s.log 2>&1
  echo "titan $s rc=$?"; grep -i "Error" $S/titan2-$s.log | head -3 | cut -c1-300; f $S/titan2-$s.log | grep -v micro_pipeline | tail -4 | cut -c1-250; el titan $s
done
python3 -m benchmarks.training.titan_compare $S/titan/tp2-off.json $S/titan/tp2-on.json 2>&1 | tail -12
left=$(( 585 - $(date +%s) + t0 ))
timeout $left torchrun --nproc-per-node 2 -m benchmarks.decode.decode_layers \
  --models 70B,405B --layers O,FC2 --tokens 1,8,32,128,256 --extra none --own-all-reduce --out $S/dec2 > $S/dec2.log 2>&1
echo "decode rc=$?"; f $S/dec2.log | grep "acceptance\|median\|minimum\|mm alone" | cut -c1-220 | head; el decode
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
