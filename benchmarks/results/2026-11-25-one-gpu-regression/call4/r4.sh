#!/usr/bin/env bash
# call 4 (one H200): README install at a894639; the main job three times (TP=1: the plan is the
# local GEMM itself, so overlap_eff should read 1); the C++ tests of the floor and the sweep CSV;
# the quick C++ sweep at TP=1.
export OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
INSTALLED_BY="README install (this run)" bash benchmarks/run_on_gpus.sh install > $OUT/session.log 2>&1
for i in 1 2 3; do timeout 120 python3 -m distgemm >> $OUT/main-job.log 2>&1; echo "main job rc $?" >> $OUT/main-job.log; done
INSTALLED_BY="README install (this run)" CPP_TESTS_K="local_floor or llama_sweep_subset or defaults_reported" CPP_TESTS_S=200 \
  bash benchmarks/run_on_gpus.sh cpp-tests >> $OUT/session.log 2>&1
B=$(python3 -c "import distgemm, pathlib; print(pathlib.Path(distgemm.__file__).parent / 'bin' / 'distgemm_bench')")
timeout 200 $B --sweep quick --tp 1 --csv $OUT/sweep-quick-tp1.csv > $OUT/sweep-quick-tp1.log 2>&1; echo "sweep rc $?" >> $OUT/sweep-quick-tp1.log
git log --oneline -1 > $OUT/commit.txt
cp .ab/s16/r4.sh $OUT/
cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz all.tgz
