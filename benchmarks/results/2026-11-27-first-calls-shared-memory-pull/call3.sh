#!/usr/bin/env bash
# Session 8 call 3 (4 GPUs): install; first_call at TP=4 and TP=2 with --profile (cProfile of
# every first call, the whole profile kept as .prof), then TP=2 again without; the shared-memory
# exchange's CPU tests on this host.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W11\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed; }
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this call)'
timeout 120 python3 -m pytest -q tests/test_control_shm.py > $S/test-control-shm.log 2>&1; echo "test_control_shm rc=$?"; tail -1 $S/test-control-shm.log
fc() {  # name, nproc, devices, extra
  CUDA_VISIBLE_DEVICES=$3 timeout 120 torchrun --master-port 29${RANDOM:0:3} --nproc-per-node $2 -m benchmarks.host.first_call $4 --out $S/first-call-$1.json > $S/first-call-$1.log 2>&1
  echo "first_call $1 rc=$?"; f $S/first-call-$1.log | grep "median\|paths" | cut -c1-160; el "$1"
}
fc tp4-profile 4 0,1,2,3 --profile; fc tp2-profile 2 0,1 --profile; fc tp2 2 0,1 ""; fc tp4 4 0,1,2,3 ""
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
