#!/usr/bin/env bash
# Session 8 call 2 (4 GPUs): install; first_call at TP=4 and TP=2 (distgemm, torch baseline,
# distgemm again: A B A) after the S decision without plan builds and the eviction without a
# synchronisation; then the GPU tests of the paths these touch at TP=4 (capture, workspace,
# torchrun_api).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W11\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed; }
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this call)'
fc() {  # name, impl, nproc, [devices]
  CUDA_VISIBLE_DEVICES=${4:-0,1,2,3} timeout 120 torchrun --master-port 29${RANDOM:0:3} --nproc-per-node $3 -m benchmarks.host.first_call --impl $2 --out $S/first-call-$1.json > $S/first-call-$1.log 2>&1
  echo "first_call $1 rc=$?"; f $S/first-call-$1.log | grep -v "^\[" | grep -v "^  " | tail -8 | cut -c1-160; el "$1"
}
fc tp4-distgemm distgemm 4; fc tp4-torch torch 4; fc tp4-distgemm-again distgemm 4
fc tp2-distgemm distgemm 2 0,1; fc tp2-torch torch 2 0,1; fc tp2-distgemm-again distgemm 2 0,1
OUT=$S GPU_TESTS="capture workspace torchrun_api" GPU_TESTS_S=330 bash benchmarks/run_on_gpus.sh gpu-tests > $S/parts2.log 2>&1
echo "gpu-tests rc=$?"; grep "== test_\|passed\|failed" $S/parts2.log | tail -12 | cut -c1-200; el gpu-tests
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
