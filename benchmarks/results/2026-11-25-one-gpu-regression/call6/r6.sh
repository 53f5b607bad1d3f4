#!/usr/bin/env bash
# call 6 (one H200): README install after the review mend; the C++ floor tests and the main job;
# fp8_sweep (time_around) at TP=1; llama_sweep (time_around) at TP=1 on one case.
export OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
INSTALLED_BY="README install (this run)" CPP_TESTS_K="local_floor or llama_sweep_subset or defaults_reported" \
  CPP_TESTS_S=200 FP8_SWEEP_S=200 FP8_SWEEP_ARGS="--layers O" SWEEP_ARGS="--layers O --tokens 4096" \
  bash benchmarks/run_on_gpus.sh install cpp-tests fp8-sweep sweep-quick > $OUT/session.log 2>&1
timeout 120 python3 -m distgemm > $OUT/main-job.log 2>&1; echo "main job rc $?" >> $OUT/main-job.log
cp .ab/s16/r6.sh $OUT/
cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz all.tgz
