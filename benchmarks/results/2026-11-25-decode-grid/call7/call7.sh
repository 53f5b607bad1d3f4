#!/usr/bin/env bash
# call 7: README install; the fused worker's capture section (1000 checked replays, eager calls and
# an overlapped op interleaved) on 2 ranks sharing GPU 0.
export OUT
INSTALLED_BY="README install (this run)" bash benchmarks/run_on_gpus.sh install > $OUT/session.log 2>&1
(cd tests/gpu && CUDA_VISIBLE_DEVICES=0 DISTGEMM_ALLOW_SHARED_GPU=1 timeout 200 torchrun --nproc-per-node 2 \
  fused_worker.py --out $OUT/shared-b.json --sections capture --replays 1000 > $OUT/shared-b.log 2>&1; echo "shared rc $?" >> $OUT/shared-b.log)
cp .ab/call7.sh $OUT/
cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz all.tgz
