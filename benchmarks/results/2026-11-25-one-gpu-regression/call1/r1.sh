#!/usr/bin/env bash
# regression call 1 (one H200): README install; kernel, fp8 kernel and first-run tests at HEAD.
export OUT
INSTALLED_BY="README install (this run)" KERNEL_TESTS_S=200 FP8_TESTS_S=120 \
  bash benchmarks/run_on_gpus.sh install kernel-tests fp8-tests first-run > $OUT/session.log 2>&1
touch /tmp/.installed; git log --oneline -1 > $OUT/commit.txt; git status --short >> $OUT/commit.txt
cp .ab/s16/r1.sh $OUT/
cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz all.tgz
