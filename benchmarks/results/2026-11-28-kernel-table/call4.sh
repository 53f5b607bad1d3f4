#!/usr/bin/env bash
# Session 10 call 4 (4 GPUs, the last ~250 s of device time): install; the plans with cuBLASLt
# steps at TP=4 after the preload; 70B O at 4096 tokens at TP=4 with the shipped table.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed; }
pack
DISTGEMM_TEST_TP=4 DISTGEMM_TEST_RESULTS=$S/results timeout 60 python3 -m pytest -q -rs tests/gpu/test_cublaslt_plans.py > $S/plans-tests.log 2>&1
echo "plans tests rc=$?"; tail -2 $S/plans-tests.log; el plans-tests
pack
timeout 45 torchrun --nproc-per-node 4 -m benchmarks.sweep.llama_sweep --models 70B --layers O --tokens 4096 --out $S/sweep-o > $S/sweep-o.log 2>&1
echo "sweep O rc=$?"; grep -E "^ *70B" $S/sweep-o.log | cut -c1-220; el sweep
pack; rm -rf $S; ls $OUT
