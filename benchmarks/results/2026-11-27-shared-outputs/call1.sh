#!/usr/bin/env bash
# Session 9 call 1 (4 GPUs): install; test_allreduce_kernel at TP=4 (shared outputs);
# --reduce-only calibration at TP=4 and TP=2; decode at TP=4 (70B/405B O, FC2 at 128, 256) and
# TP=2 (70B O, FC2 at 128, 256) with two_shot and two_shot_pull forced.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S/tests $S/cal4 $S/cal2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W11\|\*\*\*\*\|OMP_NUM\|^\s*$" "$@"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1
git log --oneline -1
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -2 $S/parts1.log; el installed; }
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this call)'
DISTGEMM_TEST_TP=4 DISTGEMM_TEST_RESULTS=$S/tests timeout 150 python3 -m pytest -q -rs tests/gpu/test_allreduce_kernel.py > $S/test-allreduce-tp4.log 2>&1
echo "test_allreduce_kernel tp4 rc=$?"; tail -4 $S/test-allreduce-tp4.log | cut -c1-300; el allreduce-tests
python3 -c "
import json,glob,sys
for p in glob.glob(sys.argv[1]+'/**/*.json', recursive=True):
    t=open(p).read()
    try: d=json.loads(t)
    except Exception: continue
    rs=d.get('results', d) if isinstance(d, dict) else d
    for e in (rs if isinstance(rs, list) else []):
        if isinstance(e, dict) and 'shared' in str(e.get('name','')): print(p[-40:], {k: e[k] for k in e if k not in ('digests',)})
" $S/tests 2>&1 | head -4 | cut -c1-400
pack
DISTGEMM_CALIBRATION=$S/cal4 timeout 60 torchrun --nproc-per-node 4 -m distgemm.tune --calibrate --reduce-only > $S/cal-tp4.log 2>&1
echo "cal tp4 rc=$?"; f $S/cal-tp4.log | tail -5 | cut -c1-180; el cal4
CUDA_VISIBLE_DEVICES=0,1 DISTGEMM_CALIBRATION=$S/cal2 timeout 60 torchrun --master-port 29533 --nproc-per-node 2 -m distgemm.tune --calibrate --reduce-only > $S/cal-tp2.log 2>&1
echo "cal tp2 rc=$?"; f $S/cal-tp2.log | tail -5 | cut -c1-180; ls $S/cal4 $S/cal2; el cal2
pack
DISTGEMM_CALIBRATION=$S/cal4 timeout 200 torchrun --nproc-per-node 4 -m benchmarks.decode.decode_layers --models 70B,405B --layers O,FC2 --extra none --tokens 128,256 --own-all-reduce two_shot,two_shot_pull --out $S/decode4 > $S/decode-tp4.log 2>&1
echo "decode tp4 rc=$?"; f $S/decode-tp4.log | grep -v "^\[" | tail -24 | cut -c1-250; el decode4
pack
CUDA_VISIBLE_DEVICES=0,1 DISTGEMM_CALIBRATION=$S/cal2 timeout 100 torchrun --master-port 29534 --nproc-per-node 2 -m benchmarks.decode.decode_layers --models 70B --layers O,FC2 --extra none --tokens 128,256 --own-all-reduce two_shot,two_shot_pull --out $S/decode2 > $S/decode-tp2.log 2>&1
echo "decode tp2 rc=$?"; f $S/decode-tp2.log | grep -v "^\[" | tail -16 | cut -c1-250; el decode2
pack; rm -rf $S; ls $OUT
