#!/usr/bin/env bash
# call 8: README install; K steps in 132 equal shares (32-bit division) against the rule, 70B O, 70B FC2, 8B O.
export OUT
INSTALLED_BY="README install (this run)" bash benchmarks/run_on_gpus.sh install > $OUT/session.log 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv -lms 500 > $OUT/smi.csv 2>&1 &
SMI=$!
timeout 300 python3 .ab/grid_ab.py $OUT/ab.json 1,32 > $OUT/ab.log 2>&1; echo "ab rc $?" >> $OUT/ab.log
kill $SMI
cp .ab/grid_ab.py .ab/call8.sh $OUT/
cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz all.tgz
