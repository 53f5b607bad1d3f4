#!/usr/bin/env bash
# Session 8 call 4 (4 GPUs): install; tests/gpu/test_allreduce_kernel.py at TP=4 (two_shot_pull
# with the others); capture, workspace, torchrun_api (the shared direct lanes); first_call at
# TP=4 and TP=2; calibrate at TP=4 (two_shot_pull priced); decode at TP=4 under it, forced
# variants too (70B O, 70B FC2, 405B O at 8, 128, 256 tokens).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S/tests $S/cal
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W11\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed; }
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this call)'
DISTGEMM_TEST_TP=4 DISTGEMM_TEST_RESULTS=$S/tests timeout 150 python3 -m pytest -q -rs tests/gpu/test_allreduce_kernel.py > $S/test-allreduce-tp4.log 2>&1
echo "test_allreduce_kernel tp4 rc=$?"; tail -6 $S/test-allreduce-tp4.log | cut -c1-300; el allreduce-tests
OUT=$S GPU_TESTS="capture workspace torchrun_api" GPU_TESTS_S=200 bash benchmarks/run_on_gpus.sh gpu-tests > $S/parts2.log 2>&1
echo "gpu-tests rc=$?"; grep "== test_\|passed\|failed" $S/parts2.log | tail -8 | cut -c1-200; el gpu-tests
fc() {  # name, nproc, devices
  CUDA_VISIBLE_DEVICES=$3 timeout 90 torchrun --master-port 29${RANDOM:0:3} --nproc-per-node $2 -m benchmarks.host.first_call --out $S/first-call-$1.json > $S/first-call-$1.log 2>&1
  echo "first_call $1 rc=$?"; f $S/first-call-$1.log | grep "median\|paths" | cut -c1-160
}
fc tp4 4 0,1,2,3; fc tp2 2 0,1; el first-calls
DISTGEMM_CALIBRATION=$S/cal timeout 90 torchrun --nproc-per-node 4 -m distgemm.tune --calibrate > $S/cal-tp4.log 2>&1
echo "cal tp4 rc=$?"; f $S/cal-tp4.log | tail -8 | cut -c1-180; ls $S/cal; el cal4
DISTGEMM_CALIBRATION=$S/cal timeout 170 torchrun --nproc-per-node 4 -m benchmarks.decode.decode_layers --models 70B,405B --layers O,FC2 --extra none --tokens 8,128,256 --own-all-reduce --out $S/decode > $S/decode-tp4.log 2>&1
echo "decode tp4 rc=$?"; f $S/decode-tp4.log | grep -v "^\[" | tail -30 | cut -c1-250; el decode
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
