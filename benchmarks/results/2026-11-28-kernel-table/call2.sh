#!/usr/bin/env bash
# Session 10 call 2 (4 GPUs): install (it ships the H100 kernel table measured in call 1); the
# cuBLASLt GPU tests (one GPU), the plans with cuBLASLt steps at TP=4; then the acceptance run of
# issue 44: kernel_vs_cublas on the 180 local GEMMs of TP 2, 4, 8 with the shipped table (the
# kernel 'auto' runs against torch.mm, A B A), 45 shapes per GPU at once, joined by --replot.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | head -1
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed; }
pack
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m pytest -q -rs tests/gpu/test_kernel_gemm.py -k "cublaslt or kernel_table or benchmark" > $S/kernel-tests.log 2>&1
echo "kernel tests rc=$?"; tail -3 $S/kernel-tests.log; el kernel-tests
DISTGEMM_TEST_TP=4 DISTGEMM_TEST_RESULTS=$S/results timeout 150 python3 -m pytest -q -rs tests/gpu/test_cublaslt_plans.py > $S/plans-tests.log 2>&1
echo "plans tests rc=$?"; tail -3 $S/plans-tests.log; el plans-tests
pack
mkdir -p $S/acc
for i in 0 1 2 3; do
  CUDA_VISIBLE_DEVICES=$i timeout 300 python3 -m benchmarks.kernel.kernel_vs_cublas --tp 2,4,8 --local-only \
    --configs "" --skip $((45 * i)) --limit 45 --budget-s 280 --out $S/acc --stem acc-$i > $S/acc-$i.log 2>&1 &
done
wait; el accepted
python3 -m benchmarks.kernel.kernel_vs_cublas --replot $S/acc/acc-0.json $S/acc/acc-1.json $S/acc/acc-2.json $S/acc/acc-3.json --out $S/acc --stem acceptance > $S/acc-joined.log 2>&1
tail -n 12 $S/acc-joined.log | cut -c1-300
pack; rm -rf $S; ls $OUT
