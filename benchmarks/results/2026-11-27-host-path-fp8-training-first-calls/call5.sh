#!/usr/bin/env bash
# Session 6 call 5 (4 GPUs, one process per GPU): install; distgemm's chosen kernel (plus the
# 128x256 configuration) against torch.mm on every local GEMM of the sweep at TP 2, 4 and 8
# (180 shapes, 45 per GPU), then one combined report.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S/kernel
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 -c 'import distgemm' 2>/dev/null || { OUT=$S bash benchmarks/run_on_gpus.sh install > $S/parts1.log 2>&1; tail -1 $S/parts1.log; el installed; }
export INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this run)'
for i in 0 1 2 3; do
  CUDA_VISIBLE_DEVICES=$i timeout 360 python3 -m benchmarks.kernel.kernel_vs_cublas --tp 2,4,8 --local-only \
    --configs 128x256 --skip $((i * 45)) --limit 45 --budget-s 320 --out $S/kernel --stem kvc-gpu$i > $S/kvc-gpu$i.log 2>&1 &
done
wait; el kernel_vs_cublas
for i in 0 1 2 3; do grep -c "^ *[0-9]" $S/kvc-gpu$i.log; tail -3 $S/kvc-gpu$i.log | cut -c1-200; done
python3 -m benchmarks.kernel.kernel_vs_cublas --replot $S/kernel/kvc-gpu*.json --out $S/kernel --stem kernel-vs-cublas-tp248-h100 > $S/replot.log 2>&1
tail -30 $S/replot.log | cut -c1-200
cd $OUT && tar czf a.tgz s && rm -rf s; ls $OUT
