#!/bin/bash
cd "$(dirname "$0")"
mkdir -p $OUT
for n in d128 d128c d128vlc d64 d64c_h_vl d80 d80c d96 d192 d256 d256c d256lc_h xd64_p6 xd64c_p6 xd80_p6; do
  timeout 25 bin/$n > $OUT/$n.log 2>&1; echo "rc=$?" >> $OUT/$n.log
done
grep -H "RESULT\|FAIL\|HANG\|error\|refused\|rc=[1-9]" $OUT/*.log | sed 's|.*/||' > $OUT/summary.txt
cat $OUT/summary.txt
for spec in d128:4096 d128:1024 d128c:16384 d64:4096 d80:4096 d80c:16384 d96:4096 d192:4096 d256:4096 d256c:16384 \
  xd64_n128:4096 xd64_p6:4096 xd64_p4:4096 xd64_pp0:4096 xd64_n224:4096 xd80_p6:4096 xd80_n160:4096 xd80_pp0:4096 \
  xd128_n160:4096 xd128_n192:4096 xd128_pp0:4096 xd128_p8:4096 xd192_pp1:4096 xd256_pp1:4096 xd256c_pp1:16384 xd96_p6:4096; do
  b=${spec%%:*}; s=${spec#*:}; echo -n "$b " >> $OUT/perf.txt; timeout 30 bin/$b --perf $s 2>&1 | grep PERF >> $OUT/perf.txt
done
cat $OUT/perf.txt
