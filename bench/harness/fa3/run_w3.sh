#!/bin/bash
# Prepared for a later session (perf-notes "fa3 d128: what the pair result says is left"): three
# consumer warpgroups at d128 (M = 192, N = 80, 0 spills) against the default two (M = 128, N = 160,
# pairs). Correctness of every w3 build first, then interleaved timing, two rounds. Logs to $OUT.
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
for b in bin/w3_*; do n=$(basename $b); timeout 30 $b > $OUT/$n.log 2>&1; echo "rc=$?" >> $OUT/$n.log; done
grep -H "RESULT\|FAIL\|HANG\|rc=[1-9]" $OUT/w3_*.log | sed 's|.*/||' > $OUT/w3_correct.txt; cat $OUT/w3_correct.txt
for round in 1 2; do
  for v in w2 w3; do
    for spec in ${v}_d128:4096,1024 ${v}_d128c:16384; do
      b=${spec%%:*}; s=${spec#*:}
      echo -n "r$round $b " >> $OUT/w3_perf.txt
      timeout 30 bin/$b --perf ${s//,/ } 2>&1 | grep PERF | sed 's/PERF //;s/bf16 //' | tr '\n' ' ' >> $OUT/w3_perf.txt
      echo >> $OUT/w3_perf.txt
    done
  done
done
cat $OUT/w3_perf.txt
