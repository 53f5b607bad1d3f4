#!/usr/bin/env bash
# call 4: README install of this tree; the same install of 39e0ee7 (the kernel before this
# session) into a venv of its own; then the two alternately, one process each: new, base, new, base.
export OUT
INSTALLED_BY="README install (this run)" bash benchmarks/run_on_gpus.sh install > $OUT/session.log 2>&1
python3 -m venv --system-site-packages /tmp/vb
(cd .ab/base && DISTGEMM_OFFLINE=1 PYTHON=/tmp/vb/bin/python bash scripts/install.sh "[test]" > $OUT/install-base.log 2>&1; echo "base install rc $?" >> $OUT/install-base.log)
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv -lms 500 > $OUT/smi.csv 2>&1 &
SMI=$!
export BENCH_ROOT=$PWD
for i in 1 2; do
  (cd /tmp && timeout 100 python3 $BENCH_ROOT/.ab/probe3.py new $OUT/new$i.json) >> $OUT/probe.log 2>&1
  (cd /tmp && timeout 100 /tmp/vb/bin/python $BENCH_ROOT/.ab/probe3.py base $OUT/base$i.json) >> $OUT/probe.log 2>&1
done
kill $SMI
cp .ab/probe3.py .ab/call4.sh $OUT/
cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz all.tgz
