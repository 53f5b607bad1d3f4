set -u
export OUT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
INSTALLED_BY="README install (this run)" timeout -k 5 200 bash benchmarks/run_on_gpus.sh install > $OUT/session.log 2>&1
for i in 1 2 3 4 5 6; do
  timeout -k 5 40 python3 .ab/decode_probe2.py p$i $OUT/p$i.json 2>&1 | grep -v Warning | tee $OUT/p$i.log
done
(cd $OUT && tar czf /tmp/all.tgz . && mv /tmp/all.tgz all.tgz)
