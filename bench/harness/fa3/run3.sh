#!/bin/bash
cd "$(dirname "$0")"
mkdir -p $OUT
for n in n_d64 n_d32 n_d64c_h_vl n_d192c n_d64vl; do timeout 25 bin/$n > $OUT/$n.log 2>&1; echo "rc=$?" >> $OUT/$n.log; done
grep -H "RESULT\|FAIL\|HANG\|rc=[1-9]" $OUT/*.log | sed 's|.*/||'
for spec in n_d64:4096 n_d192c:16384 n_d64c_h_vl:16384; do b=${spec%%:*}; s=${spec#*:}; echo -n "$b " >> $OUT/perf.txt; timeout 30 bin/$b --perf $s 2>&1 | grep PERF >> $OUT/perf.txt; done
cat $OUT/perf.txt; cat $OUT/n_d64.log
