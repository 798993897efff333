#!/bin/bash
cd "$(dirname "$0")"
mkdir -p $OUT
timeout 20 bin/d128 > $OUT/d128.log 2>&1; echo "rc=$?" >> $OUT/d128.log
cat $OUT/d128.log
if grep -q "HANG\|rc=124" $OUT/d128.log; then
  for b in d128h d64; do timeout 15 bin/$b > $OUT/$b.log 2>&1; echo "rc=$?" >> $OUT/$b.log; cat $OUT/$b.log; done
  exit 0
fi
for b in bin/*; do n=$(basename $b); [ $n = d128 ] && continue
  timeout 25 $b > $OUT/$n.log 2>&1; echo "rc=$?" >> $OUT/$n.log
  if grep -q "HANG" $OUT/$n.log; then echo "$n HANG"; fi
done
grep -H "PASS\|FAIL\|HANG\|error\|refused\|rc=[1-9]" $OUT/*.log | sed 's|.*/||' > $OUT/summary.txt
cat $OUT/summary.txt
for spec in d128:4096 d64:4096 d80:4096 d96:4096 d192:4096 d256:4096 d128c:16384 d80c:16384 d256c:16384 d128:1024; do
  b=${spec%%:*}; s=${spec#*:}; timeout 30 bin/$b --perf $s 2>&1 | grep PERF >> $OUT/perf.txt
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv >> $OUT/perf.txt
cat $OUT/perf.txt
