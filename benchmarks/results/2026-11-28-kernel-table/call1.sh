#!/usr/bin/env bash
# Session 10 call 1 (4 GPUs): install; the cuBLASLt GPU tests (one GPU); the kernel table's
# measurement: kernel_vs_cublas on the 180 local GEMMs of TP 2, 4, 8 (model's pick, cuBLASLt
# ranks 0 and 1), 45 shapes per GPU at once, then the shards' tables merged.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed; }
python3 -c 'from distgemm import _core as c; print("cuda_runtime", c.cuda_runtime, "cublaslt", repr(c.cublaslt_problem()) if c.cuda_runtime else "-")'
pack
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -q -rs tests/gpu/test_kernel_gemm.py -k "cublaslt or kernel_table or benchmark" > $S/kernel-tests.log 2>&1
echo "kernel tests rc=$?"; tail -4 $S/kernel-tests.log; el tests
python3 -c 'from distgemm import _core as c; print("cublaslt version", c.cublaslt_version())'
pack
mkdir -p $S/cal
for i in 0 1 2 3; do
  CUDA_VISIBLE_DEVICES=$i timeout 400 python3 -m benchmarks.kernel.kernel_vs_cublas --tp 2,4,8 --local-only \
    --configs "" --cublas-algos 2 --kernel-table off --skip $((45 * i)) --limit 45 --budget-s 370 \
    --out $S/cal --stem cal-$i --table $S/cal/table-$i.json > $S/cal-$i.log 2>&1 &
done
wait; el calibrated
tail -n 3 $S/cal-*.log | cut -c1-250
python3 -m benchmarks.kernel.kernel_vs_cublas --merge $S/cal/table-0.json $S/cal/table-1.json $S/cal/table-2.json $S/cal/table-3.json --table $S/cal/table.json
python3 - <<'PY' $S/cal/table.json
import json, sys, collections
t = json.load(open(sys.argv[1]))
print(t["gpu"], len(t["rows"]), collections.Counter(r["kernel"] if r["kernel"] != "cublaslt" else f"cublaslt:{r['algo']}" for r in t["rows"]))
PY
pack; rm -rf $S; ls $OUT
