set -u
export OUT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
INSTALLED_BY="README install (this run)" timeout -k 5 200 bash benchmarks/run_on_gpus.sh install > $OUT/session.log 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv -lms 500 > $OUT/smi.csv &
SMI=$!
H=cpp/include/distgemm/kernel/fused_decode_sm90.cuh
timeout -k 5 90 python3 .ab/decode_probe.py base-fresh $OUT/base-fresh.json 1 2>&1 | grep -v Warning | tee $OUT/base-fresh.log
python3 .ab/variant2.py l2_128 && (time DISTGEMM_OFFLINE=1 bash scripts/install.sh) > $OUT/re-l2_128.log 2>&1
timeout -k 5 90 python3 .ab/decode_probe.py l2_128 $OUT/l2_128.json 1 2>&1 | grep -v Warning | tee $OUT/l2_128.log
timeout -k 5 90 python3 .ab/decode_probe.py l2_128-t32 $OUT/l2_128-t32.json 32 2>&1 | grep -v Warning | tee $OUT/l2_128-t32.log
git checkout -q $H && echo "// rebuilt" >> $H && (time DISTGEMM_OFFLINE=1 bash scripts/install.sh) > $OUT/re-base.log 2>&1
timeout -k 5 90 python3 .ab/decode_probe.py base-rebuilt $OUT/base-rebuilt.json 1 2>&1 | grep -v Warning | tee $OUT/base-rebuilt.log
timeout -k 5 90 python3 .ab/decode_probe.py base-rebuilt-t32 $OUT/base-rebuilt-t32.json 32 2>&1 | grep -v Warning | tee $OUT/base-rebuilt-t32.log
git checkout -q $H
kill $SMI
(cd $OUT && tar czf /tmp/all.tgz . && mv /tmp/all.tgz all.tgz)
