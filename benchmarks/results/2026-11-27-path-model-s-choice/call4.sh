#!/usr/bin/env bash
# Session 7 call 4 (4 GPUs): install; tests/gpu/test_training.py at TP=4 (layers' numerics of
# every gradient, bf16 and fp16; the compiled MLP, aot_eager with no graph break and inductor).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S/tests
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed; }
DISTGEMM_TEST_TP=4 DISTGEMM_TEST_RESULTS=$S/tests timeout 200 python3 -m pytest -q -rs tests/gpu/test_training.py > $S/test-training-tp4.log 2>&1
echo "test_training tp4 rc=$?"; tail -8 $S/test-training-tp4.log | cut -c1-220; el test_training
python3 -c "
import json; d=json.load(open('$S/tests/training.json'))
print(d.get('mode')); c=d.get('checks',[]); print(len(c), 'checks,', sum(1 for x in c if not x.get('ok')), 'failed')
" 2>&1 | tail -3
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
