set -u
export OUT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
INSTALLED_BY="README install (this run)" timeout -k 5 200 bash benchmarks/run_on_gpus.sh install > $OUT/session.log 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv -lms 500 > $OUT/smi.csv &
SMI=$!
for v in base evict l2none l2_128; do
  git checkout -q cpp/include/distgemm/kernel/fused_decode_sm90.cuh
  if [ $v != base ]; then python3 .ab/variant2.py $v && (time DISTGEMM_OFFLINE=1 bash scripts/install.sh) > $OUT/re-$v.log 2>&1 || echo "rebuild $v failed"; fi
  timeout -k 5 90 python3 .ab/decode_probe.py $v $OUT/$v.json 2>&1 | grep -v Warning | tee $OUT/$v.log
done
git checkout -q cpp/include/distgemm/kernel/fused_decode_sm90.cuh
kill $SMI
(cd $OUT && tar czf /tmp/all.tgz . && mv /tmp/all.tgz all.tgz)
