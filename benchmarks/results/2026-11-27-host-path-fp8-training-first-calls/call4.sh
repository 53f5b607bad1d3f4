#!/usr/bin/env bash
# Session 6 call 4 (4 GPUs): install; first calls of 96 token counts at TP=4 and TP=2: distgemm
# (cProfile), the unfused torch + NCCL baseline (own process), distgemm with eager module loading.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
f() { grep -v "^W11\|\*\*\*\*\|OMP_NUM\|^\s*$\|^\[rank" "$@"; }
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed; }
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this run)'
for tp in 4 2; do
  dv=$([ $tp = 2 ] && echo 0,1 || echo 0,1,2,3)
  for v in torch distgemm eager; do
    extra=""; envs=""
    [ $v = torch ] && extra="--impl torch"
    [ $v = distgemm ] && extra="--profile"
    [ $v = eager ] && envs="CUDA_MODULE_LOADING=EAGER"
    env $envs CUDA_VISIBLE_DEVICES=$dv timeout 150 torchrun --nproc-per-node $tp -m benchmarks.host.first_call $extra --out $S/first-call-tp$tp-$v.json > $S/first-call-tp$tp-$v.log 2>&1
    echo "== tp$tp $v rc=$?"; f $S/first-call-tp$tp-$v.log | head -16 | cut -c1-160; el first_call $tp $v
  done
done
f $S/first-call-tp4-distgemm.log | grep -A40 "host profile" | cut -c1-200
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
