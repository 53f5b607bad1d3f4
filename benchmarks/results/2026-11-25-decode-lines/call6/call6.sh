set -u
export OUT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
INSTALLED_BY="README install (this run)" FUSED_TP1_ARGS="--tokens 1,8,16,32" FUSED_TP1_S=300 \
  timeout -k 5 440 bash benchmarks/run_on_gpus.sh install fused-tp1 > $OUT/session.log 2>&1
(cd $OUT && tar czf /tmp/all.tgz . && mv /tmp/all.tgz all.tgz)
