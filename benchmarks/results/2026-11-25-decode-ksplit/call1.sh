#!/usr/bin/env bash
# One H200: README install with the K-split decode kernel; fused-tp1 and training-local; then the
# previous decode kernel (patch reversed, incremental reinstall) and fused-tp1 again.
set -u
export OUT
INSTALLED_BY="README install (this run)" FUSED_TP1_ARGS="--tokens 1,8,16,32" FUSED_TP1_S=200 \
  TRAINING_LOCAL_S=150 timeout -k 5 520 bash benchmarks/run_on_gpus.sh install fused-tp1 training-local \
  > "$OUT/session.log" 2>&1
echo "first part rc=$?" >> "$OUT/session.log"
patch -R -p1 < .ab/decode-ksplit.patch > "$OUT/reinstall-old.log" 2>&1
t0=$(date +%s)
DISTGEMM_OFFLINE=1 timeout 150 bash scripts/install.sh >> "$OUT/reinstall-old.log" 2>&1
echo "reinstall rc=$? in $(( $(date +%s) - t0 )) s" >> "$OUT/reinstall-old.log"
mkdir -p "$OUT/fused-tp1-old"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/fused_tp1.py --tokens 1,8,16,32 --skip-check \
  --out "$OUT/fused-tp1-old" > "$OUT/fused-tp1-old.log" 2>&1
echo "old rc=$?" >> "$OUT/fused-tp1-old.log"
cd "$OUT" && tar czf all.tgz --exclude '*.tgz' .
