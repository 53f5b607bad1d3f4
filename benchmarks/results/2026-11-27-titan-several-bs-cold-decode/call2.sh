#!/usr/bin/env bash
# Session 5 call 2 (4 GPUs, warm: the install of call 1): the full calibration at TP=4 (cold
# weights, the 503 MB reduce shape); decode under it on 70B/405B O and FC2 with our all-reduces
# and both fused tails forced too.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S /tmp/dg/cal
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W1127\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
python3 -c "import distgemm, torch; print(distgemm.__file__, torch.__version__)" || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; el reinstalled; }
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (call 1 on this machine)'
timeout 150 torchrun --nproc-per-node 4 -m distgemm.tune --calibrate --out /tmp/dg/cal/tp4.json > $S/cal4.log 2>&1
echo "calibrate rc=$?"; f $S/cal4.log | tail -14 | cut -c1-220; cp /tmp/dg/cal/tp4.json $S/cal-tp4.json; el calibrated
[ -s /tmp/dg/cal/tp4.json ] && export DISTGEMM_CALIBRATION=/tmp/dg/cal/tp4.json
left=$(( 585 - $(date +%s) + t0 ))
timeout $left torchrun --nproc-per-node 4 -m benchmarks.decode.decode_layers \
  --models 70B,405B --layers O,FC2 --tokens 1,8,32,128,256 --extra none --own-all-reduce --out $S/dec4 > $S/dec4.log 2>&1
echo "decode rc=$?"; f $S/dec4.log | grep "auto\|acceptance\|median\|minimum\|mm alone" | cut -c1-220 | head -30; el decode
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
