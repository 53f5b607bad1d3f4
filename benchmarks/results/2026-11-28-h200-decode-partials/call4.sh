#!/usr/bin/env bash
# Session 18 call 4 (fresh 2-GPU machine, TP=2): install; the fused kernels' resident CTAs; the
# all-reduce GPU tests at TP=2; the decode calibration (--reduce-only, with the shape whose tiles
# come in pieces) at TP=2; issue 42's decode grid on Llama-8B (tiles in pieces: shapes the fit
# did not run) under that calibration.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S/calibrate
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
cp $S/env.txt $S/env-install.txt; pack
python3 -c "
import torch; from distgemm import _core
print('fused_resident_ctas decode', _core.fused_resident_ctas('bf16', 1, 0), 'cutlass', _core.fused_resident_ctas('bf16', 64, 0), 'SMs', torch.cuda.get_device_properties(0).multi_processor_count)
" 2>&1 | tee $S/resident.txt
NP=$(nvidia-smi -L | wc -l)
GPU_TESTS="allreduce_kernel" GPU_TEST_S=120 OUT=$S bash benchmarks/run_on_gpus.sh gpu-tests > $S/parts2.log 2>&1
grep -E "rc=|passed|failed" $S/parts2.log | head -6; el gpu-tests; pack
timeout 150 torchrun --nproc-per-node $NP -m distgemm.tune --calibrate --reduce-only \
  --out $S/calibrate/tp$NP-reduce.json > $S/calibrate.log 2>&1; echo "calibrate rc $?"
grep -v "^W1128\|\*\*\*\*" $S/calibrate.log | tail -14 | cut -c1-200; el calibrated; pack
if [ -s $S/calibrate/tp$NP-reduce.json ]; then export DISTGEMM_CALIBRATION=$S/calibrate/tp$NP-reduce.json; fi
echo "DISTGEMM_CALIBRATION=${DISTGEMM_CALIBRATION:-shipped}"
DECODE_S=230 DECODE_ARGS="--models 8B --extra none" OUT=$S bash benchmarks/run_on_gpus.sh decode > $S/parts3.log 2>&1; tail -1 $S/parts3.log
grep -E "auto |median|minimum|mm alone" $S/decode.log | cut -c1-150 | head -45; el decode
pack; rm -rf $S; ls $OUT
