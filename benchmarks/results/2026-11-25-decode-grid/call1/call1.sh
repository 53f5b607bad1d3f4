#!/usr/bin/env bash
# call 1: README install; the balanced grid against the previous decomposition (A/B, TP=1);
# the fused worker's correctness, mixed and timeout sections on 2 ranks sharing GPU 0.
export OUT
INSTALLED_BY="README install (this run)" bash benchmarks/run_on_gpus.sh install > $OUT/session.log 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv -lms 500 > $OUT/smi.csv 2>&1 &
SMI=$!
timeout 250 python3 .ab/grid_ab.py $OUT/ab.json 1,32 > $OUT/ab.log 2>&1; echo "ab rc $?" >> $OUT/ab.log
(cd tests/gpu && CUDA_VISIBLE_DEVICES=0 DISTGEMM_ALLOW_SHARED_GPU=1 timeout 150 torchrun --nproc-per-node 2 \
  fused_worker.py --out $OUT/shared-a.json --sections correctness,mixed,timeout --replays 500 > $OUT/shared-a.log 2>&1; echo "shared rc $?" >> $OUT/shared-a.log)
kill $SMI
cp .ab/grid_ab.py .ab/call1.sh $OUT/
