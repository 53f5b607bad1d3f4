#!/usr/bin/env bash
# The GPU measurements and test suites on one multi-GPU Hopper machine, in named parts so that
# each fits a time limit; TP = every visible GPU. Everything runs on the package that the
# README's install builds on that machine (part `install`, first):
#
#   OUT=dir bash benchmarks/run_on_gpus.sh install first-run timing-study sweep-full
#   OUT=dir bash benchmarks/run_on_gpus.sh install api timeline sweep-quick cpp-sweep-quick cpp-tests
#
# Parts (each under its own timeout, logs in $OUT/<part>.log, files in $OUT/<part>/):
#   install          the README's install on a machine without network: the nvidia-cutlass wheel
#                    from .whl/, then DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]"
#   first-run        tests/gpu/test_first_run.py (main job, import orders, quick sweep, tp_mlp)
#   timing-study     sweep.timing_study (short alternating chunks vs steady windows)
#   api              tests/gpu/run_api_checks.sh (torchrun worker: correctness, paths, errors,
#                    10,000 replays, host overhead; the Python-vs-C++ bench; examples/tp_mlp.py)
#   kernel-tests     python3 -m pytest tests/gpu/test_kernel_gemm.py (every kernel configuration
#                    through _core.gemm, stream-K's workspace, the kernel-vs-cuBLAS benchmark)
#   fp8-tests        python3 -m pytest tests/gpu/test_kernel_fp8.py (the fp8 kernels through
#                    _core.gemm: both scale kinds and accumulation modes against torch._scaled_mm)
#   fp8-ops          python3 -m pytest tests/gpu/test_fp8_ops.py (the fp8 ops: every schedule and
#                    scale kind, captured replays, refusals; one GPU: 2 ranks share it over gloo)
#   shared-api       tests/gpu/torchrun_worker.py --sections correctness,paths on 2 ranks sharing
#                    GPU 0 (DISTGEMM_ALLOW_SHARED_GPU=1, gloo): the plans where only one GPU is lent
#   shared-gpu-tests the multi-rank GPU tests as 2 ranks sharing GPU 0 (CUDA_VISIBLE_DEVICES=0:
#                    gloo, DISTGEMM_ALLOW_SHARED_GPU=1; functional only, never a multi-GPU result):
#                    tests/gpu/test_{fused,capture,workspace,training,torchrun_api,fp8_ops}.py, one
#                    pytest each under ${SHARED_TEST_S:-240} s ($SHARED_GPU_TESTS picks some, e.g.
#                    "fused capture"); logs and the workers' JSON in $OUT/shared-gpu-tests/, a
#                    summary per JSON at the end (tests/gpu/results_summary.py)
#   gpu-tests        the multi-rank GPU tests at TP = every GPU, one pytest each under
#                    ${GPU_TEST_S:-150} s: tests/gpu/test_{fused,capture,workspace,fp8_ops,training,
#                    torchrun_api,tuning_gpu,collective_memory,async_tp_switch,allreduce_kernel}.py ($GPU_TESTS picks
#                    some); logs and the workers' JSON in $OUT/gpu-tests/
#   cpp-tests        python3 -m pytest tests/gpu/test_cpp_bench.py (the C++ runtime grid)
#   cpp-fp8          the fp8 cases of tests/gpu/test_cpp_bench.py (-k fp8), then distgemm_bench
#                    --sweep quick at fp8 (row scales; row scales with fast accumulation) and bf16
#   calibrate        python -m distgemm.tune --calibrate at TP = every GPU, and at TP = 2 on GPUs 0
#                    and 1 where there are more: the cost model's machine constants, in calibrate/
#   timeline         timeline.overlap_timeline (per-stream picture of one case)
#   first-calls      host.first_call --phases at TP = every GPU under DISTGEMM_KERNEL_TABLE_PLANS
#                    all (the default), then one-rank, then the same at TP = 2 (GPUs 0 and 1); then
#                    probes.cublaslt_host_cost on GPU 0 (cuBLASLt's host cost per new shape)
#   sweep-quick|full sweep.llama_sweep [--quick] $SWEEP_ARGS (e.g. "--models 405B")
#   sweep-fc         sweep.llama_sweep --models 70B --layers FC1,FC2 (every token count)
#   cpp-sweep-quick|full  distgemm_bench --sweep quick|full
#   cpp-variants     the quick C++ sweep per (reduce-scatter partial transport, PDL) pair, twice,
#                    at TP = every GPU and TP = 2 (sweep.compare_variants summarises)
#   training         training.training_step $TRAINING_ARGS (Llama-70B MLP block fwd+bwd: distgemm
#                    keep/regather vs NCCL + torch.mm vs torch async-TP vs the GEMM floor)
#   titan            training.titan_async_tp at TP = every GPU: torchtitan 0.2.2's Llama-3 (8B layer
#                    shapes, $TITAN_ARGS, default 4 layers, 50 steps, 8192 tokens) with torch's
#                    async-TP, distgemm's switch off then on, then training.titan_compare (losses
#                    within bf16 tolerance, tokens/s on/off); wheels from .whl/titan/
#                    (benchmarks/training/titan_wheels.sh; benchmarks/training/TITAN.md)
#   training-local   training.training_step --local-only [--tp $TRAINING_LOCAL_TP] on GPU 0: the
#                    block's two floors alone (GEMMs; the compiled step without communication)
#   serving          serving.serving_step $SERVING_ARGS (Llama-70B 8-layer TP stack: decode batches
#                    1..256 in CUDA graphs, prefill 2048..8192 eager; distgemm vs the best unfused
#                    of mm + NCCL, one-shot, two-shot, NCCL symmetric; torch symm_mem at prefill;
#                    ms per step and memory per variant)
#   decode           decode.decode_layers --models 70B,405B --tokens 1..256 $DECODE_ARGS (O, FC2
#                    GEMM + all-reduce in graphs of 20 calls: mm, mm + NCCL, mm + one_shot,
#                    mm + two_shot, mm + NCCL symmetric, distgemm; distgemm vs the best unfused
#                    and issue 42's acceptance; DECODE_ARGS="--models 8B" adds the rest)
#   copy-probe       probes.copy_engine_split on every GPU (torch only): the reduce-scatter ring's
#                    pushes under a GEMM, back to back, then --paced (each waits for its GEMM, as
#                    in a plan), then --spread --paced (a push's parts to different peers); then
#                    probes.sm_push (the pushes by k CTAs of a kernel instead, beside cuBLASLt
#                    GEMMs that leave those SMs free); JSON in copy-probe/
#   fused-tp1        decode.fused_tp1 $FUSED_TP1_ARGS on GPU 0: the fused GEMM + all-reduce at TP=1
#                    (its kernel, flags and reduction without NVLink) vs torch.mm on 70B/405B O and
#                    FC2 (--shapes adds any N x K) at tokens 1..256, cold weights, weight bandwidth,
#                    and its correctness in bf16 and fp16 (the collective path's bits too)
#   cpp-tiles        kernel.compare_tiles (the GEMM's two tiles per shape, one GPU), then the C++
#                    sweep at 1024/2048 tokens with --tile-n auto and 256, two rounds each
#   fp8-sweep        fp8.fp8_sweep $FP8_SWEEP_ARGS (70B layers at 8192 tokens: fp8 distgemm vs bf16
#                    distgemm, NCCL + torch._scaled_mm, torch's fused scaled ops)
#   fp8-kernel       fp8.fp8_kernel_vs_scaled_mm ${FP8_ARGS:---tp 2} on GPU 0: the fp8 kernels vs
#                    torch._scaled_mm, bf16 torch.mm and distgemm's bf16 kernel
#   kernel-table     the machine's kernel table: kernel.kernel_vs_cublas --cublas-algos 2 on
#                    ${KERNEL_TABLE_ARGS:---tp 2,4,8 --local-only}, the list split over every GPU,
#                    the parts' tables merged into kernel-table/table.json (ship it as
#                    python/distgemm/data/kernels/<gpu>.json)
#   fp8-table        the fp8 rows of one scale kind: fp8.fp8_kernel_vs_scaled_mm --cublas --table on
#                    ${FP8_TABLE_ARGS:-the 180 local shapes of 8B/70B/405B at TP 2, 4, 8 and 1024..16384
#                    tokens, --scales $FP8_SCALES (default tensor)}, shapes [FP8_FIRST, FP8_FIRST +
#                    FP8_COUNT) of the list split over every GPU (so that one list can span calls on
#                    one machine); every part kept in $FP8_TABLE_DIR (default /tmp/distgemm-fp8-table)
#                    and merged after the machine's shipped table (whose rows stay) into
#                    fp8-table/table.json
#   fp8-acceptance   issue 44's fp8 acceptance: fp8.fp8_kernel_vs_scaled_mm --variants ours_fp8
#                    --kernel-table ${FP8_KERNEL_TABLE:-shipped} on the same list and range, split
#                    over every GPU; fp8.fp8_acceptance merges the parts into a verdict and plot
#   kernel-vs-cublas kernel.kernel_vs_cublas ${KERNEL_ARGS:---tp 2 --local-only} on GPU 0:
#                    distgemm's GEMM kernel (both tiles, the wave model's pick) vs torch.mm per
#                    Llama GEMM shape
# Each benchmark part runs its module of benchmarks/ (benchmarks/README.md) from the repository
# root: python3 -m benchmarks.<family>.<script>, or torchrun --nproc-per-node $NPROC -m ...
# CPP_TESTS_K narrows cpp-tests to a pytest -k expression.
# While the parts run, nvidia-smi samples SM clock, power and throttle reasons every 500 ms
# ($OUT/smi.csv): the context for every TF/s number. At the end everything under $OUT is packed
# into $OUT/gpu-session.tgz (the device tool returns at most 8 files).
#
# $BENCH defaults to the installed package's distgemm/bin/distgemm_bench.
set -u
OUT=${OUT:-$PWD/gpu-logs}
installed_bench() {
  python3 -c "import distgemm, pathlib; print(pathlib.Path(distgemm.__file__).parent / 'bin' / 'distgemm_bench')" 2>/dev/null
}
NPROC=${NPROC:-$(nvidia-smi -L | wc -l)}
mkdir -p "$OUT"
export DISTGEMM_TEST_TP=$NPROC   # the GPU tests run at TP = every visible GPU
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
env_report() {
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,power.limit,clocks.max.sm,memory.total \
    --format=csv; nvidia-smi topo -m
  python3 -c "import torch, distgemm; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'distgemm', distgemm.__file__)"
  echo "installed by: ${INSTALLED_BY:-whatever was importable (no install part in this run)}"
  python3 -m pip show distgemm nvidia-cutlass 2>/dev/null | grep -E "^(Name|Version|Location)"
} > "$OUT/env.txt" 2>&1
}
env_report
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
  --format=csv -lms 500 > "$OUT/smi.csv" 2>&1 &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT

rc=0
part() {  # part NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s)"
  mkdir -p "$OUT/$name"
  timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local r=$?
  echo "== $name rc=$r in $((SECONDS - t0)) s"
  [ $r -eq 0 ] || rc=1
  return $r
}

# pytest_files_part NAME TOTAL_S PER_FILE_S "TESTS" [VAR=VALUE ...]: one pytest per test file
# (tests/gpu/test_<t>.py for each t in TESTS), each under PER_FILE_S so that one hang costs only
# its own results, all under TOTAL_S, with VAR=VALUE in their environment; logs and the workers'
# JSON in $OUT/NAME/, a summary per JSON at the end.
pytest_files_part() {
  local name=$1 total=$2 per=$3 tests=$4; shift 4
  part "$name" "$total" env "$@" DISTGEMM_TEST_RESULTS="$OUT/$name" \
    DISTGEMM_TEST_LOG="$OUT/$name/commands.log" DISTGEMM_TORCHRUN_TIMEOUT=$(( per - 20 )) \
    bash -c 'set -u; rc=0
      for t in $0; do
        timeout -k 10 "$1" python3 -m pytest -q -rs "tests/gpu/test_$t.py" > "$2/$t.log" 2>&1
        r=$?; [ $r -eq 0 ] || rc=1
        echo "== test_$t.py rc=$r"; tail -n 12 "$2/$t.log"
      done
      python3 tests/gpu/results_summary.py "$2"; exit $rc' "$tests" "$per" "$OUT/$name"
}

for p in "$@"; do
  BENCH=${BENCH:-$(installed_bench)}
  case $p in
    install) part install 600 bash -c 'set -e
        python3 -m pip install -q --no-index --no-deps .whl/nvidia_cutlass-*.whl
        time DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]"' &&
        INSTALLED_BY='README install: pip install .whl/nvidia_cutlass-*.whl; DISTGEMM_OFFLINE=1 bash scripts/install.sh "[test]" (this run)'
        export INSTALLED_BY; env_report; unset BENCH ;;
    first-run) part first-run 600 env DISTGEMM_TEST_LOG="$OUT/first-run/commands.log" \
                 python3 -m pytest -q -rs tests/gpu/test_first_run.py ;;
    timing-study) part timing-study 200 torchrun --nproc-per-node "$NPROC" -m benchmarks.sweep.timing_study --out "$OUT/timing-study" ;;
    api) part api 300 env OUT="$OUT/api" API_TIMEOUT=240 bash tests/gpu/run_api_checks.sh ;;
    kernel-tests) part kernel-tests ${KERNEL_TESTS_S:-400} python3 -m pytest -q -rs tests/gpu/test_kernel_gemm.py ;;
    fp8-tests) part fp8-tests ${FP8_TESTS_S:-300} python3 -m pytest -q -rs tests/gpu/test_kernel_fp8.py ;;
    fp8-ops) part fp8-ops ${FP8_OPS_S:-400} env DISTGEMM_TEST_RESULTS="$OUT/fp8-ops" \
                 python3 -m pytest -q -rs tests/gpu/test_fp8_ops.py ;;
    fp8-sweep) part fp8-sweep ${FP8_SWEEP_S:-400} torchrun --nproc-per-node "$NPROC" -m benchmarks.fp8.fp8_sweep \
                 ${FP8_SWEEP_ARGS:-} --out "$OUT/fp8-sweep" ;;
    shared-api) part shared-api ${SHARED_API_S:-400} env DISTGEMM_ALLOW_SHARED_GPU=1 CUDA_VISIBLE_DEVICES=0 \
                 torchrun --nproc-per-node 2 tests/gpu/torchrun_worker.py --sections correctness,paths \
                 --out "$OUT/shared-api/results.json" ;;
    shared-gpu-tests) pytest_files_part shared-gpu-tests ${SHARED_TESTS_S:-590} ${SHARED_TEST_S:-240} \
        "${SHARED_GPU_TESTS:-fused capture workspace training torchrun_api fp8_ops}" \
        CUDA_VISIBLE_DEVICES=0 DISTGEMM_CALLS=${SHARED_CALLS:-2000} ;;
    gpu-tests) pytest_files_part gpu-tests ${GPU_TESTS_S:-590} ${GPU_TEST_S:-150} \
        "${GPU_TESTS:-fused capture workspace fp8_ops training torchrun_api tuning_gpu collective_memory async_tp_switch allreduce_kernel}" \
        DISTGEMM_CALLS=${GPU_CALLS:-2000} ;;
    fp8-kernel) part fp8-kernel ${FP8_S:-400} python3 -m benchmarks.fp8.fp8_kernel_vs_scaled_mm \
              ${FP8_ARGS:---tp 2} --budget-s $(( ${FP8_S:-400} - 30 )) --out "$OUT/fp8-kernel" ;;
    cpp-tests) part cpp-tests ${CPP_TESTS_S:-330} env DISTGEMM_BENCH="$BENCH" python3 -m pytest -q -x -rs \
                 ${CPP_TESTS_K:+-k "$CPP_TESTS_K"} tests/gpu/test_cpp_bench.py ;;
    cpp-fp8) part cpp-fp8 ${CPP_FP8_S:-540} bash -c '
        set -u; rc=0
        env DISTGEMM_BENCH="$0" python3 -m pytest -q -rs -k fp8 tests/gpu/test_cpp_bench.py || rc=1
        for run in "fp8-row:--dtype fp8 --scales row" "fp8-row-fa:--dtype fp8 --scales row --fast-accum" \
                   "bf16:--dtype bf16"; do
          "$0" --sweep quick --tp "$2" ${run#*:} --csv "$1/${run%%:*}.csv" > "$1/${run%%:*}.log" 2>&1
          r=$?; [ $r -eq 0 ] || rc=1
          echo "quick sweep ${run#*:} rc=$r"; tail -n 12 "$1/${run%%:*}.log"
        done; exit $rc' "$BENCH" "$OUT/cpp-fp8" "$NPROC" ;;
    cpp-variants) part cpp-variants ${CPP_VARIANTS_S:-300} bash -c '
        # The quick C++ sweep (70B x 4 layers x 4096/8192 tokens, S = TP and 2TP, verified) under
        # each (partial transport, PDL) pair, in two interleaved rounds (drift shows as the
        # round-to-round spread), at TP = every GPU and at TP = 2; one CSV per run.
        set -u; rc=0
        for tp in $(echo "$0 2" | tr " " "\n" | sort -un); do
          for round in 1 2; do
            for via in epilogue copy; do for pdl in pdl no-pdl; do
              "$1" --sweep quick --tp $tp --partial-via $via --$pdl \
                --csv "$2/tp$tp-$via-$pdl-r$round.csv" > "$2/tp$tp-$via-$pdl-r$round.log" 2>&1
              r=$?; [ $r -eq 0 ] || rc=1
              echo "tp=$tp round=$round $via $pdl rc=$r"
            done; done
          done
        done; exit $rc' "$NPROC" "$BENCH" "$OUT/cpp-variants" ;;
    cpp-tiles) part cpp-tiles ${CPP_TILES_S:-300} bash -c '
        set -u; rc=0
        python3 -m benchmarks.kernel.compare_tiles --bench "$0" --csv "$1/tiles.csv" || rc=1
        for run in auto-r1 256-r1 256-r2 auto-r2; do  # interleaved: drift hits both alike
          "$0" --sweep full --tokens 1024,2048 --tile-n ${run%-*} --csv "$1/small-$run.csv" \
            > "$1/small-$run.log" 2>&1
          r=$?; [ $r -eq 0 ] || rc=1
          echo "small-token sweep --tile-n $run rc=$r"; tail -n 1 "$1/small-$run.log"
        done; exit $rc' "$BENCH" "$OUT/cpp-tiles" ;;
    calibrate) part calibrate 400 bash -c 'set -e  # TP = every GPU, then TP = 2 on GPUs 0 and 1
        torchrun --nproc-per-node "$0" -m distgemm.tune --calibrate --out "$1/calibrate/tp$0.json"
        if [ "$0" -gt 2 ]; then CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node 2 \
          -m distgemm.tune --calibrate --out "$1/calibrate/tp2.json"; fi' "$NPROC" "$OUT" ;;
    first-calls) part first-calls 300 bash -c 'set -e
        for scope in all one-rank; do DISTGEMM_KERNEL_TABLE_PLANS=$scope torchrun \
          --nproc-per-node "$0" -m benchmarks.host.first_call --phases \
          --out "$1/first-calls/tp$0-$scope.json"; done
        if [ "$0" -gt 2 ]; then for scope in all one-rank; do CUDA_VISIBLE_DEVICES=0,1 \
          DISTGEMM_KERNEL_TABLE_PLANS=$scope torchrun --nproc-per-node 2 -m benchmarks.host.first_call \
          --phases --out "$1/first-calls/tp2-$scope.json"; done; fi
        CUDA_VISIBLE_DEVICES=0 python3 -m benchmarks.probes.cublaslt_host_cost \
          "$1/first-calls/cublaslt-host-cost.json"' "$NPROC" "$OUT" ;;
    timeline) part timeline 150 torchrun --nproc-per-node "$NPROC" -m benchmarks.timeline.overlap_timeline --out "$OUT/timeline" ;;
    sweep-quick) part sweep-quick 300 torchrun --nproc-per-node "$NPROC" -m benchmarks.sweep.llama_sweep --quick ${SWEEP_ARGS:-} --out "$OUT/sweep-quick" ;;
    sweep-full) part sweep-full ${SWEEP_S:-590} torchrun --nproc-per-node "$NPROC" -m benchmarks.sweep.llama_sweep ${SWEEP_ARGS:-} --out "$OUT/sweep-full" ;;
    sweep-fc) part sweep-fc 300 torchrun --nproc-per-node "$NPROC" -m benchmarks.sweep.llama_sweep --models 70B --layers FC1,FC2 --out "$OUT/sweep-fc" ;;
    training) part training ${TRAINING_S:-450} torchrun --nproc-per-node "$NPROC" -m benchmarks.training.training_step ${TRAINING_ARGS:-} --out "$OUT/training" ;;
    titan) part titan ${TITAN_S:-560} bash -c 'set -e
        python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/titan-site .whl/titan/*.whl
        export PYTHONPATH=/tmp/titan-site${PYTHONPATH:+:$PYTHONPATH}
        for s in off on; do
          torchrun --nproc-per-node "$0" -m benchmarks.training.titan_async_tp --switch $s \
            ${TITAN_ARGS:-} --out "$1/titan/tp$0-$s.json"
        done
        python3 -m benchmarks.training.titan_compare "$1/titan/tp$0-off.json" "$1/titan/tp$0-on.json"' \
        "$NPROC" "$OUT" ;;
    training-local) part training-local ${TRAINING_LOCAL_S:-200} env CUDA_VISIBLE_DEVICES=0 python3 \
              -m benchmarks.training.training_step --local-only ${TRAINING_LOCAL_TP:+--tp $TRAINING_LOCAL_TP} --out "$OUT/training-local" ;;
    serving) part serving ${SERVING_S:-450} torchrun --nproc-per-node "$NPROC" -m benchmarks.serving.serving_step ${SERVING_ARGS:-} --out "$OUT/serving" ;;
    decode) part decode ${DECODE_S:-560} torchrun --nproc-per-node "$NPROC" -m benchmarks.decode.decode_layers --models 70B,405B \
              --tokens 1,2,4,8,16,32,64,128,256 ${DECODE_ARGS:-} --out "$OUT/decode" ;;
    copy-probe) part copy-probe ${COPY_PROBE_S:-200} bash -c 'set -e
        for run in "back-to-back:" "paced:--paced" "spread-paced:--spread --paced"; do
          echo "== ${run%%:*}"
          python3 -m benchmarks.probes.copy_engine_split ${run#*:} --out "$0/copy-probe/${run%%:*}.json"
        done
        echo "== sm-push"; python3 -m benchmarks.probes.sm_push --out "$0/copy-probe/sm-push.json"' "$OUT" ;;
    fused-tp1) part fused-tp1 ${FUSED_TP1_S:-420} env CUDA_VISIBLE_DEVICES=0 python3 -m benchmarks.decode.fused_tp1 \
              ${FUSED_TP1_ARGS:-} --out "$OUT/fused-tp1" ;;
    kernel-table) part kernel-table ${KERNEL_TABLE_S:-500} bash -c '
        # The list split over every GPU, one part each at once; then the tables of the parts merged.
        set -u; rc=0; args=$3
        n=$(python3 -m benchmarks.kernel.kernel_vs_cublas $args --dry-run | tail -n 1 | cut -d" " -f1)
        per=$(( (n + $0 - 1) / $0 )); tables=(); pids=()
        for i in $(seq 0 $(( $0 - 1 ))); do
          CUDA_VISIBLE_DEVICES=$i python3 -m benchmarks.kernel.kernel_vs_cublas $args --configs "" \
            --cublas-algos 2 --kernel-table off --skip $(( i * per )) --limit $per \
            --budget-s $(( $2 - 60 )) --out "$1" --stem part-$i --table "$1/table-$i.json" \
            > "$1/part-$i.log" 2>&1 &
          pids+=($!); tables+=("$1/table-$i.json")
        done
        for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
        python3 -m benchmarks.kernel.kernel_vs_cublas --merge "${tables[@]}" --table "$1/table.json" || rc=1
        exit $rc' "$NPROC" "$OUT/kernel-table" ${KERNEL_TABLE_S:-500} \
        "${KERNEL_TABLE_ARGS:---tp 2,4,8 --local-only}" ;;
    fp8-table|fp8-acceptance) part "$p" ${FP8_PART_S:-590} bash -c '
        # Shapes [first, first + count) of the list, split over the GPUs, one part each at once.
        set -u; rc=0; first=${FP8_FIRST:-0}; count=${FP8_COUNT:-180}; dir=${FP8_TABLE_DIR:-/tmp/distgemm-fp8-table}
        per=$(( (count + $0 - 1) / $0 )); pids=(); mkdir -p "$dir"
        for i in $(seq 0 $(( $0 - 1 ))); do
          skip=$(( first + i * per )); limit=$(( first + count - skip < per ? first + count - skip : per ))
          [ "$limit" -gt 0 ] || continue
          if [ "$4" = fp8-table ]; then
            what=(--cublas --variants ours_fp8,cublaslt_fp8 --kernel-table off --table "$dir/table-$skip.json")
          else
            what=(--variants ours_fp8 --kernel-table "${FP8_KERNEL_TABLE:-shipped}")
          fi
          CUDA_VISIBLE_DEVICES=$i python3 -m benchmarks.fp8.fp8_kernel_vs_scaled_mm $3 "${what[@]}" \
            --skip $skip --limit $limit --budget-s $(( $2 - 40 )) --out "$1" --stem part-$skip \
            > "$1/part-$skip.log" 2>&1 &
          pids+=($!)
        done
        for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
        if [ "$4" = fp8-table ]; then
          shipped=$(python3 -c "import torch; from distgemm.runtime import kernel_table as k; print(k.shipped_path(torch.cuda.get_device_name(0)))")
          base=(); [ -f "$shipped" ] && base=("$shipped")
          python3 -m benchmarks.kernel.kernel_vs_cublas --merge "${base[@]}" "$dir"/table-*.json \
            --table "$1/table.json" || rc=1
        else
          python3 -m benchmarks.fp8.fp8_acceptance "$1"/part-*.json --out "$1" --stem fp8-acceptance || rc=1
        fi
        exit $rc' "$NPROC" "$OUT/$p" ${FP8_PART_S:-590} \
        "${FP8_TABLE_ARGS:---models 8B,70B,405B --tp 2,4,8 --tokens 1024,2048,4096,8192,16384 --scales ${FP8_SCALES:-tensor}}" "$p" ;;
    kernel-vs-cublas) part kernel-vs-cublas ${KERNEL_S:-500} python3 -m benchmarks.kernel.kernel_vs_cublas \
              ${KERNEL_ARGS:---tp 2 --local-only} --budget-s $(( ${KERNEL_S:-500} - 40 )) --out "$OUT/kernel-vs-cublas" ;;
    cpp-sweep-quick) part cpp-sweep-quick 200 "$BENCH" --sweep quick --tp "$NPROC" --csv "$OUT/cpp-sweep-quick/cpp-sweep-quick.csv" ;;
    cpp-sweep-full) part cpp-sweep-full 400 "$BENCH" --sweep full --tp "$NPROC" --csv "$OUT/cpp-sweep-full/cpp-sweep-full.csv" ;;
    *) echo "unknown part '$p' (the parts: $(grep -oE '^    [a-z0-9|-]+\)' "$0" | tr -d ' )' | tr '\n' ' '))"; rc=1 ;;
  esac
  tail -n 25 "$OUT/$p.log" 2>/dev/null | cut -c1-250
done
kill $SMI 2>/dev/null
(cd "$OUT" && tar czf gpu-session.tgz --exclude gpu-session.tgz ./*) || rc=1
exit $rc
