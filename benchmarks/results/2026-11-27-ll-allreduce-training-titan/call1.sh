#!/usr/bin/env bash
# Session 4 call 1 (4 GPUs): install; GPU tests of the merged flag-window fix and LL all-reduce
# (allreduce_kernel, fused, capture); the all-reduce probe with the LL algorithms; decode
# calibration (--reduce-only) at TP=4; a TP=4 decode subset under it with our all-reduces forced too.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S /tmp/dg/cal
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W1127\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -3 $S/parts1.log; el installed
OUT=$S GPU_TESTS="allreduce_kernel fused capture" GPU_TEST_S=140 GPU_TESTS_S=330 bash benchmarks/run_on_gpus.sh gpu-tests > $S/parts2.log 2>&1
grep "== test_\|passed\|failed\|error" $S/parts2.log | head -20; el gpu-tests
timeout 80 torchrun --nproc-per-node 4 -m benchmarks.probes.allreduce_probe --out $S/probe > $S/probe.log 2>&1
f $S/probe.log | tail -30; el probe
timeout 90 torchrun --nproc-per-node 4 -m distgemm.tune --calibrate --reduce-only --out /tmp/dg/cal/tp4.json > $S/cal4.log 2>&1
f $S/cal4.log | tail -10; cp /tmp/dg/cal/tp4.json $S/cal-tp4.json; el calibrated
left=$(( 575 - $(date +%s) + t0 ))
DISTGEMM_CALIBRATION=/tmp/dg/cal/tp4.json timeout $left torchrun --nproc-per-node 4 -m benchmarks.decode.decode_layers \
  --models 70B,405B --layers O,FC2 --tokens 1,8,32,128 --extra none --own-all-reduce --out $S/dec4 > $S/dec4.log 2>&1
f $S/dec4.log | grep "auto\|acceptance\|median\|minimum\|mm alone" | cut -c1-220 | head -30; el decode
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
