#!/usr/bin/env bash
# Session 14 call 1 (fresh machine, TP = every GPU): install; does cuBLASLt now offer row-wise fp8
# algorithms (placeholder scale address in the heuristic query)? the fp8 cuBLASLt tests (GPU 0) and
# the cuBLASLt/table GEMM tests with the row-bucket test (GPU 1); the plan tests; first calls under
# all / one-rank with row buckets; then the row-wise fp8 table's first half (parts 0 and 1 of 4).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S /tmp/kt8
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
git log -1 --format=%h | tee $S/commit.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
python3 - <<'PY' | tee $S/rowwise-count.txt
from distgemm import _core as c
print("cublaslt", repr(c.cublaslt_problem()), c.cublaslt_version())
for m, n, k in ((4096, 8192, 8192), (1024, 2560, 8192), (16384, 28672, 4096)):
    for fast in (False, True):
        print(m, n, k, "fast" if fast else "accurate", "row-wise algos:",
              c.cublaslt_algo_count(m, n, k, "e4m3", cuda_device=0, scale_a_rows=True,
                                    scale_b_rows=True, fast_accum=fast))
PY
pack
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -rs tests/gpu/test_kernel_fp8.py -k cublaslt > $S/fp8-tests.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m pytest -q -rs tests/gpu/test_kernel_gemm.py -k "cublaslt or kernel_table or bucket" > $S/kernel-tests.log 2>&1 &
wait
echo "== fp8"; tail -3 $S/fp8-tests.log; echo "== kernel"; tail -3 $S/kernel-tests.log; el tests
DISTGEMM_TEST_TP=$NG DISTGEMM_TEST_RESULTS=$S/results timeout 120 python3 -m pytest -q -rs tests/gpu/test_cublaslt_plans.py > $S/plans-tests.log 2>&1
echo "plans tests rc=$?"; tail -3 $S/plans-tests.log; el plans-tests
OUT=$S bash benchmarks/run_on_gpus.sh first-calls > $S/parts2.log 2>&1; tail -1 $S/parts2.log
tail -n 6 $S/first-calls.log | cut -c1-200; el first-calls; pack
if grep -q "row-wise algos: [1-9]" $S/rowwise-count.txt; then
  F="--models 8B,70B,405B --tp 2,4,8 --tokens 1024,2048,4096,8192,16384 --scales row"
  LEFT=$(( 560 - ($(date +%s) - t0) )); echo "table budget ${LEFT}s"
  for i in 0 1; do
    CUDA_VISIBLE_DEVICES=$i timeout $((LEFT + 15)) python3 -m benchmarks.fp8.fp8_kernel_vs_scaled_mm $F --cublas \
      --variants ours_fp8,cublaslt_fp8 --kernel-table off --skip $((45 * i)) --limit 45 --budget-s $((LEFT - 12)) \
      --out /tmp/kt8 --stem fp8r-$i --table /tmp/kt8/table-$i.json > $S/fp8r-$i.log 2>&1 &
  done
  wait; el table-half-1; tail -n 2 $S/fp8r-*.log | cut -c1-200; cp /tmp/kt8/* $S/
fi
pack; rm -rf $S; ls $OUT
