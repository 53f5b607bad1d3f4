#!/usr/bin/env bash
# regression call 3 (one H200): README install; the main job as a user with one GPU runs it
# (python3 -m distgemm, what scripts/run.sh runs after the install); the C++ runtime tests at TP=1.
export OUT
INSTALLED_BY="README install (this run)" bash benchmarks/run_on_gpus.sh install > $OUT/session.log 2>&1
( export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  timeout 120 python3 -m distgemm > $OUT/main-job.log 2>&1; echo "main job rc $?" >> $OUT/main-job.log
  timeout 120 python3 -m distgemm --schedule rs_tile_a > $OUT/main-job-rs.log 2>&1; echo "rc $?" >> $OUT/main-job-rs.log )
INSTALLED_BY="README install (this run)" CPP_TESTS_S=330 \
  bash benchmarks/run_on_gpus.sh cpp-tests >> $OUT/session.log 2>&1
git log --oneline -1 > $OUT/commit.txt
cp .ab/s16/r3.sh $OUT/
cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz all.tgz
