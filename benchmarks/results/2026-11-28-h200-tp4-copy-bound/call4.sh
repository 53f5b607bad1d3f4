#!/usr/bin/env bash
# Session 16 call 4 (no install: torch only): the copy-engine split probe on every GPU.
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
PYTHONPATH=. timeout 120 python3 -m benchmarks.probes.copy_engine_split --out $S/ce-split-8x6.json 2>&1 | tail -12
PYTHONPATH=. timeout 120 python3 -m benchmarks.probes.copy_engine_split --mb 16 --pushes 3 --m 1024 --out $S/ce-split-16x3.json 2>&1 | tail -12
(cd $OUT && tar czf a.tgz s); rm -rf $S
