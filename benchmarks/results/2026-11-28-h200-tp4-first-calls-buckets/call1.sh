#!/usr/bin/env bash
# Session 15 call 1 (fresh machine, TP = every GPU): install; the GPU tests written after session 14's
# last call (fp8 cuBLASLt incl. the unaligned row scale on GPU 0; cuBLASLt/table GEMM tests on GPU 1;
# test_cublaslt_plans.py incl. fp8_plans at TP = every GPU). Then by GPU kind:
#   H100: issue 44's fp8 tensor-wise table (fp8-table part, 180 shapes over every GPU);
#   H200: first calls at TP = every GPU and TP = 2; the row buckets' steady state on row counts that
#         are not a power of two (kernel_vs_cublas, DISTGEMM_CUBLASLT_ROW_BUCKETS on/off/on).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
tests() {
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -q -rs tests/gpu/test_kernel_fp8.py -k cublaslt > $S/fp8-tests.log 2>&1 &
  CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -m pytest -q -rs tests/gpu/test_kernel_gemm.py -k "cublaslt or kernel_table" > $S/kernel-tests.log 2>&1 &
  wait
  echo "== fp8"; tail -3 $S/fp8-tests.log; echo "== kernel"; tail -2 $S/kernel-tests.log; el tests
  DISTGEMM_TEST_TP=$NG DISTGEMM_TEST_RESULTS=$S/results timeout 120 python3 -m pytest -q -rs tests/gpu/test_cublaslt_plans.py > $S/plans-tests.log 2>&1
  echo "plans tests rc=$?"; tail -4 $S/plans-tests.log; el plans-tests; pack
}
case $NAME in
  *H100*)
    FP8_SCALES=tensor FP8_PART_S=360 OUT=$S bash benchmarks/run_on_gpus.sh fp8-table > $S/parts2.log 2>&1
    grep "rc=" $S/parts2.log; tail -3 $S/fp8-table.log; el fp8-table-tensor
    cp /tmp/distgemm-fp8-table/table-*.json $S/fp8-table/ 2>/dev/null; pack
    tests ;;
  *)
    tests
    OUT=$S bash benchmarks/run_on_gpus.sh first-calls > $S/parts2.log 2>&1; tail -1 $S/parts2.log
    grep -E "first call ms|graph  |cublaslt" $S/first-calls.log | cut -c1-140; el first-calls; pack
    mkdir -p $S/buckets
    for pass in on off on2; do
      for i in $(seq 0 $((NG - 1))); do
        per=$(( (48 + NG - 1) / NG ))
        CUDA_VISIBLE_DEVICES=$i DISTGEMM_CUBLASLT_ROW_BUCKETS=${pass%2} timeout 150 python3 -m benchmarks.kernel.kernel_vs_cublas \
          --tp 4,8 --tokens 1536,6144 --local-only --configs "" --kernel-table shipped --skip $((i * per)) --limit $per \
          --budget-s 120 --out $S/buckets --stem $pass-$i > $S/buckets/$pass-$i.log 2>&1 &
      done
      wait; el "buckets $pass"; pack
    done ;;
esac
pack; rm -rf $S; ls $OUT
