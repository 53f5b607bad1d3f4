#!/usr/bin/env bash
# One H200: README install with the deferred tile waits; fused-tp1 (checks) and the shared-GPU
# fused tests; then the K-split kernel without deferral (patch reversed, incremental reinstall).
set -u
export OUT
INSTALLED_BY="README install (this run)" FUSED_TP1_ARGS="--tokens 1,32" FUSED_TP1_S=150 \
  SHARED_GPU_TESTS="fused" SHARED_TEST_S=200 timeout -k 5 420 \
  bash benchmarks/run_on_gpus.sh install fused-tp1 shared-gpu-tests > "$OUT/session.log" 2>&1
echo "first part rc=$?" >> "$OUT/session.log"
patch -R -p1 < .ab/defer.patch > "$OUT/reinstall-old.log" 2>&1
DISTGEMM_OFFLINE=1 timeout 60 bash scripts/install.sh >> "$OUT/reinstall-old.log" 2>&1
echo "reinstall rc=$?" >> "$OUT/reinstall-old.log"
mkdir -p "$OUT/fused-tp1-old"
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/fused_tp1.py --tokens 1,32 --skip-check \
  --out "$OUT/fused-tp1-old" > "$OUT/fused-tp1-old.log" 2>&1
echo "old rc=$?" >> "$OUT/fused-tp1-old.log"
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz all.tgz
