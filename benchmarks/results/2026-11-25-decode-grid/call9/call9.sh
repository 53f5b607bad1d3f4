#!/usr/bin/env bash
# call 9: README install; fused_tp1 at 1 and 32 tokens, after the review mend; the fused worker's
# correctness, mixed and timeout sections on 2 ranks sharing GPU 0.
export OUT
INSTALLED_BY="README install (this run)" FUSED_TP1_ARGS="--tokens 1,32" FUSED_TP1_S=300 \
  bash benchmarks/run_on_gpus.sh install fused-tp1 > $OUT/session.log 2>&1
(cd tests/gpu && CUDA_VISIBLE_DEVICES=0 DISTGEMM_ALLOW_SHARED_GPU=1 timeout 140 torchrun --nproc-per-node 2 \
  fused_worker.py --out $OUT/shared-a.json --sections correctness,mixed,timeout --replays 500 > $OUT/shared-a.log 2>&1; echo "shared rc $?" >> $OUT/shared-a.log)
cp .ab/call9.sh $OUT/
cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz all.tgz
