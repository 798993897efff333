#!/bin/bash
# Device-side driver: correctness for every binary, then perf. Logs to $OUT.
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1
for b in ${CORRECT:-bin/*}; do
  timeout 25 $b > $OUT/$(basename $b).log 2>&1; echo "rc=$?" >> $OUT/$(basename $b).log
  tail -1 $OUT/$(basename $b).log | head -1 >/dev/null
done
grep -h "PASS\|FAIL\|HANG\|error\|rc=" $OUT/*.log > $OUT/summary.txt
for spec in $PERF; do
  b=${spec%%:*}; s=${spec#*:}
  timeout 40 bin/$b --perf ${s//,/ } >> $OUT/perf.txt 2>&1
done
cat $OUT/summary.txt $OUT/perf.txt
