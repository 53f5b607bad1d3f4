#!/usr/bin/env bash
# regression call 2 (one H200, warm or fresh): the multi-rank GPU tests as 2 ranks sharing GPU 0.
export OUT
[ -f /tmp/.installed ] || INSTALLED_BY="README install (this run)" bash benchmarks/run_on_gpus.sh install > $OUT/install-session.log 2>&1
touch /tmp/.installed
SHARED_GPU_TESTS="fused capture workspace training torchrun_api fp8_ops" SHARED_TEST_S=150 SHARED_TESTS_S=540 \
  INSTALLED_BY="README install (call 1 of this machine or this run)" \
  bash benchmarks/run_on_gpus.sh shared-gpu-tests > $OUT/session.log 2>&1
git log --oneline -1 > $OUT/commit.txt
cp .ab/s16/r2.sh $OUT/
cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz all.tgz
