#!/usr/bin/env bash
# Session 8 call 1 (4 GPUs): install; tests/gpu/test_workspace.py at TP=4 (the exchanges of
# growth and IPC, now through shared memory); first_call at TP=4 (shm, store, shm) and TP=2
# (shm, store) with the finer phases.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S/tests
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W11\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed; }
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this call)'
DISTGEMM_TEST_TP=4 DISTGEMM_TEST_RESULTS=$S/tests timeout 150 python3 -m pytest -q -rs tests/gpu/test_workspace.py > $S/test-workspace-tp4.log 2>&1
echo "test_workspace tp4 rc=$?"; tail -4 $S/test-workspace-tp4.log | cut -c1-220; el test_workspace
fc() {  # name, control, nproc, [devices]
  CUDA_VISIBLE_DEVICES=${4:-0,1,2,3} DISTGEMM_CONTROL=$2 timeout 120 torchrun --master-port 29${RANDOM:0:3} --nproc-per-node $3 -m benchmarks.host.first_call --out $S/first-call-$1.json > $S/first-call-$1.log 2>&1
  echo "first_call $1 rc=$?"; f $S/first-call-$1.log | grep -v "^\[" | tail -24 | cut -c1-160; el "$1"
}
fc tp4-shm shm 4; fc tp4-store store 4; fc tp4-shm-again shm 4
fc tp2-shm shm 2 0,1; fc tp2-store store 2 0,1
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
