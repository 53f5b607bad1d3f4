#!/usr/bin/env bash
# Session 8 call 5 (4 GPUs): install; tests/gpu/test_allreduce_kernel.py at TP=4 (two_shot_pull
# reading the peers' sums); decode at TP=4, forced variants (70B O at 8, 128, 256 tokens, 70B FC2
# at 128); then calibrate at TP=4 (outputs packed after each stage).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S/tests $S/cal
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W11\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed; }
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this call)'
DISTGEMM_TEST_TP=4 DISTGEMM_TEST_RESULTS=$S/tests timeout 80 python3 -m pytest -q -rs tests/gpu/test_allreduce_kernel.py > $S/test-allreduce-tp4.log 2>&1
echo "test_allreduce_kernel tp4 rc=$?"; tail -4 $S/test-allreduce-tp4.log | cut -c1-300; el allreduce-tests; pack
timeout 100 torchrun --nproc-per-node 4 -m benchmarks.decode.decode_layers --models 70B --layers O --extra none --tokens 8,128,256 --own-all-reduce --out $S/decode > $S/decode-tp4.log 2>&1
echo "decode tp4 rc=$?"; grep "auto" $S/decode-tp4.log | cut -c1-120; el decode; pack
DISTGEMM_CALIBRATION=$S/cal timeout 70 torchrun --nproc-per-node 4 -m distgemm.tune --calibrate > $S/cal-tp4.log 2>&1
echo "cal tp4 rc=$?"; f $S/cal-tp4.log | tail -9 | cut -c1-180; el cal4; pack
ls $OUT
