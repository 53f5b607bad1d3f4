set -u
export OUT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
INSTALLED_BY="README install (this run)" FUSED_TP1_ARGS="--tokens 1,32" FUSED_TP1_S=150 \
  timeout -k 5 300 bash benchmarks/run_on_gpus.sh install fused-tp1 > $OUT/session.log 2>&1
cd tests/gpu
CUDA_VISIBLE_DEVICES=0 DISTGEMM_ALLOW_SHARED_GPU=1 timeout -k 5 90 torchrun --nproc-per-node 2 fused_worker.py \
  --out $OUT/shared-fused-a.json --sections correctness,mixed,timeout --replays 500 > $OUT/shared-fused-a.log 2>&1
echo "shared a rc=$?"
cd ../..
python3 tests/gpu/results_summary.py $OUT/shared-fused-a.json 2>&1 | tail -5
(cd $OUT && tar czf /tmp/all.tgz . && mv /tmp/all.tgz all.tgz)
