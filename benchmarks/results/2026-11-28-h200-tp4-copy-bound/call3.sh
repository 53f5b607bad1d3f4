#!/usr/bin/env bash
# Session 16 call 3 (fresh machine, TP = every GPU): install; where TP=4's efficiency goes:
# the step-split probe on GPU 0 (no communication), the per-stream timelines of 70B O at 4096
# tokens (S = 4, 8) and 70B QKV at 4096 (S = 4); first calls at TP = every GPU under `one-rank`
# then `all` (the default), one machine.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
NG=$(nvidia-smi -L | wc -l)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed
cp $S/env.txt $S/env-install.txt
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m benchmarks.probes.step_split_cost --tp $NG --out $S/step-split.json > $S/step-split.log 2>&1
echo "== step split rc=$?"; cat $S/step-split.log | cut -c1-200; el step-split; pack
mkdir -p $S/timeline
for v in "O 8" "O 4" "QKV 4"; do set -- $v
  timeout 100 torchrun --nproc-per-node $NG -m benchmarks.timeline.overlap_timeline --model 70B --layer $1 \
    --tokens 4096 --steps $2 --out $S/timeline/$1-S$2 > $S/timeline/$1-S$2.log 2>&1
  echo "== timeline $1 S=$2 rc=$?"; grep -iE "busy|overlap|gemm|copy|distgemm" $S/timeline/$1-S$2/*.txt 2>/dev/null | head -30 | cut -c1-180; el "timeline $1 $2"; pack
done
mkdir -p $S/first-calls
for scope in one-rank all; do
  DISTGEMM_KERNEL_TABLE_PLANS=$scope timeout 100 torchrun --nproc-per-node $NG \
    -m benchmarks.host.first_call --phases --out $S/first-calls/tp$NG-$scope.json > $S/first-calls/tp$NG-$scope.log 2>&1
  echo "== $scope rc=$?"; grep -E "first call ms|graph  |heuristic  |torch GEMM|preload|enqueue" $S/first-calls/tp$NG-$scope.log | cut -c1-140
done; el first-calls
pack; rm -rf $S; ls $OUT
