# kRun 4 (the checkout) against kRun 8 of the accurate fp8 kernel, each on its own README install,
# then the tile-order probe on TP=1 fp8 shapes. $1 = output dir.
set -u
OUTD=$1
export OUT=$OUTD/k4; mkdir -p $OUT
FP8_S=140 FP8_ARGS="--tp 2 --tokens 8192 --stem k4" bash benchmarks/run_on_gpus.sh install fp8-kernel > $OUTD/k4.log 2>&1
PYTHONPATH=$PWD PROBE_SHAPES=tp1 PROBE_DTYPES=e4m3 timeout 100 python3 diag/order_probe.py $OUTD/probe-tp1.json 70 > $OUTD/probe-tp1.log 2>&1
sed -i 's/static constexpr int kRun = 4;/static constexpr int kRun = 8;/' cpp/include/distgemm/kernel/fp8_split_promotion.cuh
grep -n "kRun = " cpp/include/distgemm/kernel/fp8_split_promotion.cuh >> $OUTD/k8.log
export OUT=$OUTD/k8; mkdir -p $OUT
FP8_S=140 FP8_ARGS="--tp 2 --tokens 8192 --stem k8" bash benchmarks/run_on_gpus.sh install fp8-kernel >> $OUTD/k8.log 2>&1
grep -h "C7514\|spill" $OUTD/k8/install.log | head -5 >> $OUTD/k8.log
