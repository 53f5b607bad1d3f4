#!/usr/bin/env bash
# call 5: README install of this tree; 39e0ee7 (the kernel before this session) built by the same
# pip command as scripts/install.sh into a folder of its own (--target, first on PYTHONPATH); then
# the two alternately, one process each: new, base, new, base.
export OUT
INSTALLED_BY="README install (this run)" bash benchmarks/run_on_gpus.sh install > $OUT/session.log 2>&1
(export PATH=/usr/local/cuda/bin:$PATH; time python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/basepkg ./.ab/base > $OUT/install-base.log 2>&1; echo "base install rc $?" >> $OUT/install-base.log) 2>> $OUT/install-base.log
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv -lms 500 > $OUT/smi.csv 2>&1 &
SMI=$!
export BENCH_ROOT=$PWD
for i in 1 2; do
  (cd /tmp && timeout 100 python3 $BENCH_ROOT/.ab/probe3.py new $OUT/new$i.json) >> $OUT/probe.log 2>&1
  (cd /tmp && PYTHONPATH=/tmp/basepkg timeout 100 python3 $BENCH_ROOT/.ab/probe3.py base $OUT/base$i.json) >> $OUT/probe.log 2>&1
done
kill $SMI
cp .ab/probe3.py .ab/call5.sh $OUT/
cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz all.tgz
