#!/usr/bin/env bash
# Everything the GPU runtime issue asks to be checked on a 2-GPU Hopper machine, in one call:
#   tests/gpu/run_gpu_checks.sh [fail] [verify] [tune] [perf] [replays]   (default: all)
# `tune` times the GEMM alone (TP=1) for every tile order (swizzle x raster) on the FC1 and O
# per-device shapes and hands the best to `perf` (which also runs the default order).
# Logs go to a scratch folder and, packed, to $OUT/logs.tgz (the device tool returns at most 8
# files); $OUT/summary.txt and the last lines printed are the summary table.
# Uses build-gpu/distgemm_bench; builds it here with cmake if the carried one cannot run.
set -u
FINAL=${OUT:-$PWD/gpu-logs}
OUT=$(mktemp -d /tmp/distgemm-gpu-XXXX)
mkdir -p "$FINAL"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=$PWD/build-gpu:${LD_LIBRARY_PATH:-}
BIN=$PWD/build-gpu/distgemm_bench
SUM=$FINAL/summary.txt
: > "$SUM"
parts=${*:-fail verify tune perf replays}
SCHEDS=${SCHEDS:-ag_rotate_a ag_rotate_b rs_tile_a rs_tile_b ar_tile_a}
TUNED=${TUNED:-}  # e.g. "--swizzle 4 --raster 2" from an earlier tune

{ nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  nvidia-smi topo -m; nvcc --version | tail -2; uname -r; } > "$OUT/env.txt" 2>&1

if ! "$BIN" --schedule ag_rotate_a --tp 1 --steps 1 --m 256 --n 256 --k 256 --iterations 2 \
     --warmup 1 --no-local > "$OUT/smoke.txt" 2>&1; then
  echo "carried binary failed: $(tail -3 "$OUT/smoke.txt")" | tee -a "$SUM"
  python3 -m pip install -q --no-index --no-deps .whl/nvidia_cutlass-*.whl > "$OUT/build.txt" 2>&1
  rm -rf build-gpu && cmake -S . -B build-gpu -G Ninja -DDISTGEMM_PYTHON=OFF -DDISTGEMM_TESTS=OFF \
    >> "$OUT/build.txt" 2>&1 && cmake --build build-gpu -j 16 >> "$OUT/build.txt" 2>&1 \
    || { echo "build failed"; tail -30 "$OUT/build.txt"; exit 1; }
fi

# run NAME TIMEOUT EXPECT ARGS...: runs the bench, records exit code and the RESULT line.
run() {
  local name=$1 tmo=$2 expect=$3; shift 3
  local log="$OUT/$name.log"
  timeout "$tmo" "$BIN" "$@" > "$log" 2>&1
  local rc=$?
  local res; res=$(grep '^RESULT' "$log" | tail -1 | sed 's/^RESULT //')
  local st=ok; [ "$rc" = "$expect" ] || st=BAD
  printf '%-4s rc=%-3s %-44s %s\n' "$st" "$rc" "$name" "$res" >> "$SUM"
  if [ "$st" = BAD ]; then tail -4 "$log" | sed 's/^/      /' >> "$SUM"; fi
}

if [[ $parts == *verify* ]]; then
  for sch in $SCHEDS; do
    for S in 2 4 8; do
      for dt in bf16 fp16; do
        IFS='|' read -ra epis <<< "${EPI:-0 -|0.5 -|0 bias|0.5 bias}"
        for eb in "${epis[@]}"; do
          set -- $eb; beta=$1; b=""; [ "$2" = bias ] && b=--bias
          run "v_${sch}_S${S}_${dt}_b${beta}_${2}" 120 0 --schedule $sch --tp 2 --steps $S \
            --m 2048 --n 1024 --k 1024 --dtype $dt --beta $beta $b --iterations 3 --warmup 1 --warmup-ms 0 --no-local
        done
      done
    done
    run "v_${sch}_S8_pdl" 120 0 --schedule $sch --tp 2 --steps 8 --m 2048 --n 1024 --k 1024 \
      --beta 0.5 --bias --pdl --iterations 3 --warmup 1 --warmup-ms 0 --no-local
    run "v_${sch}_L3_S4" 120 0 --schedule $sch --tp 2 --steps 4 --m 1024 --n 1024 --k 512 --l 3 \
      --beta 0.5 --bias --alpha 0.75 --iterations 3 --warmup 1 --warmup-ms 0 --no-local
    run "upd_${sch}_S4" 120 0 --schedule $sch --tp 2 --steps 4 --m 4096 --n 4096 --k 4096 \
      --beta 0.5 --bias --check-update --iterations 5 --warmup 2 --warmup-ms 0 --no-local
  done
fi

if [[ $parts == *fail* ]]; then
  run fail_missing_dev1_ag 60 1 --schedule ag_rotate_a --tp 2 --steps 2 --m 2048 --n 1024 --k 1024 \
    --timeout-s 2 --simulate-missing-device 1
  run fail_missing_dev0_rs 60 1 --schedule rs_tile_a --tp 2 --steps 4 --m 2048 --n 1024 --k 1024 \
    --timeout-s 2 --simulate-missing-device 0
  run fail_missing_dev1_ar 60 1 --schedule ar_tile_a --tp 2 --steps 2 --m 2048 --n 1024 \
    --k 1024 --timeout-s 2 --simulate-missing-device 1
  run reject_k_unaligned 60 2 --schedule ag_rotate_a --tp 2 --steps 2 --m 512 --n 512 --k 516
  run reject_tile_unaligned 60 2 --schedule rs_tile_b --tp 2 --steps 8 --m 512 --n 1056 --k 512
  for f in fail_missing_dev1_ag fail_missing_dev0_rs fail_missing_dev1_ar reject_k_unaligned reject_tile_unaligned; do
    grep -h '^error' "$OUT/$f.log" | head -2 | cut -c1-300 | sed "s/^/  $f: /" >> "$SUM"
  done
fi

if [[ $parts == *tune* ]]; then
  best=0
  for sw in 1 2 4 8; do
    for r in ${RASTERS:-0 1 2}; do
      run "tune_fc1local_sw${sw}_r${r}" 120 0 --schedule ag_rotate_a --tp 1 --steps 1 --m 8192 \
        --n 28672 --k 8192 --iterations 30 --warmup 5 --no-verify --no-local --swizzle $sw --raster $r
      run "tune_olocal_sw${sw}_r${r}" 120 0 --schedule rs_tile_a --tp 1 --steps 1 --m 8192 \
        --n 8192 --k 4096 --iterations 30 --warmup 5 --no-verify --no-local --swizzle $sw --raster $r
      run "tune_fc2local_sw${sw}_r${r}" 120 0 --schedule rs_tile_a --tp 1 --steps 1 --m 8192 \
        --n 8192 --k 14336 --iterations 30 --warmup 5 --no-verify --no-local --swizzle $sw --raster $r
      t1=$(grep -ho 'tflops_per_gpu=[0-9.]*' "$OUT/tune_fc1local_sw${sw}_r${r}.log" | cut -d= -f2)
      t2=$(grep -ho 'tflops_per_gpu=[0-9.]*' "$OUT/tune_olocal_sw${sw}_r${r}.log" | cut -d= -f2)
      t3=$(grep -ho 'tflops_per_gpu=[0-9.]*' "$OUT/tune_fc2local_sw${sw}_r${r}.log" | cut -d= -f2)
      tot=$(python3 -c "print(int(float('${t1:-0}') + float('${t2:-0}') + float('${t3:-0}')))")
      if [ "$tot" -gt "$best" ]; then best=$tot; TUNED="--swizzle $sw --raster $r"; fi
    done
  done
  echo "tuned tile order: $TUNED (sum of TF/s $best)" >> "$SUM"
fi

# perf_cases PREFIX SUFFIX EXTRA...: the four Llama-70B TP=2 cases at steps $S.
perf_cases() {
  local p=$1 sfx=$2; shift 2
  run "${p}_fc1_ag_S$S$sfx" 180 0 --schedule ag_rotate_a --tp 2 --steps $S --m 8192 --n 57344 \
    --k 8192 --iterations 50 --warmup 10 "$@"
  run "${p}_fc2_rs_S$S$sfx" 180 0 --schedule rs_tile_a --tp 2 --steps $S --m 8192 --n 8192 \
    --k 28672 --iterations 50 --warmup 10 "$@"
  run "${p}_qkv_ag_S$S$sfx" 180 0 --schedule ag_rotate_a --tp 2 --steps $S --m 8192 --n 10240 \
    --k 8192 --iterations 50 --warmup 10 "$@"
  run "${p}_o_rs_S$S$sfx" 180 0 --schedule rs_tile_a --tp 2 --steps $S --m 8192 --n 8192 \
    --k 8192 --iterations 50 --warmup 10 "$@"
}

if [[ $parts == *perf* ]]; then
  for S in ${PERF_STEPS:-2 4 8}; do
    if [ -n "$TUNED" ] && [ "$TUNED" != "--swizzle 8 --raster 0" ]; then  # else = defaults
      perf_cases perft "" $TUNED
    fi
    for v in ${PERF_VARIANTS:-plain --pdl}; do
      if [ "$v" = plain ]; then perf_cases perf ""; else perf_cases perf _pdl $v; fi
    done
  done
fi

if [[ $parts == *replays* ]]; then
  run replays_o_rs_S2 300 0 --schedule rs_tile_a --tp 2 --steps 2 --m 8192 --n 8192 --k 8192 \
    --iterations 20 --warmup 5 --replays 10000 --no-local $TUNED
  grep -h '^replays' "$OUT/replays_o_rs_S2.log" >> "$SUM"
fi

tar -czf "$FINAL/logs.tgz" -C "$OUT" .
cp "$OUT/env.txt" "$FINAL/"
echo "== summary =="
cat "$SUM"
