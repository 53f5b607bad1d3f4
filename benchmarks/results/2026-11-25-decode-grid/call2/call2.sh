#!/usr/bin/env bash
# call 2: README install; 405B-wide decode GEMMs: the rule's grid (128 CTAs, 2 whole tiles each)
# against all 132 resident CTAs (whole tiles, 1 or 2 each), same kernel, interleaved, TP=1.
export OUT
INSTALLED_BY="README install (this run)" bash benchmarks/run_on_gpus.sh install > $OUT/session.log 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv -lms 500 > $OUT/smi.csv 2>&1 &
SMI=$!
timeout 300 python3 .ab/grid_ab.py $OUT/ab.json 1,8,32 > $OUT/ab.log 2>&1; echo "ab rc $?" >> $OUT/ab.log
kill $SMI
cp .ab/grid_ab.py .ab/call2.sh $OUT/
cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz all.tgz
