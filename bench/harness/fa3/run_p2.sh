#!/bin/bash
cd "$(dirname "$0")"; mkdir -p $OUT
for n in c_d72_w3 c_d32_w3 c_d104_so c_d128lsc_so c_d80vl_w3 c_d64lc_w3 t_d80c_w3 t_d64c_w3 t_d128c_so t_d96_w3; do timeout 20 bin/$n > $OUT/$n.log 2>&1; echo "rc=$?" >> $OUT/$n.log; done
grep -H "RESULT\|FAIL\|HANG\|rc=[1-9]" $OUT/*.log | sed 's|.*/||'
for spec in b_d80c:16384 t_d80c_so:16384 t_d80c_rb:16384 t_d80c_w3:16384 t_d80c_w3norb:16384 b_d64c:16384 t_d64c_w3:16384 b_d128c:16384 t_d128c_so:16384 t_d80_w3:4096 t_d80_w3norb:4096 t_d96_w3:4096 t_d96_sorb:4096 t_d64_w3:4096 t_d64_w3norb:4096 t_d128_so:4096,1024 b_d80c:16384; do b=${spec%%:*}; s=${spec#*:}; echo -n "$b " >> $OUT/perf.txt; timeout 12 bin/$b --perf ${s//,/ } 2>&1 | grep PERF | sed 's/PERF //;s/bf16 //' | tr '\n' ' ' >> $OUT/perf.txt; echo >> $OUT/perf.txt; done
cat $OUT/perf.txt
