#!/bin/bash
cd "$(dirname "$0")"; mkdir -p $OUT
for n in c_d64vlc_w3 c_d80lsc_sorb c_d128vl_sorb c_d80c_sorb t_d128c_sorb t_d64_w3 t_d128_sorb; do timeout 20 bin/$n > $OUT/$n.log 2>&1; echo "rc=$?" >> $OUT/$n.log; done
grep -H "RESULT\|FAIL\|HANG\|rc=[1-9]" $OUT/*.log | sed 's|.*/||'
for spec in b_d64:4096 t_d64_rb:4096 t_d64_sorb:4096 t_d64_w3:4096 t_d64_w3n112:4096 t_d64_w3noso:4096 b_d80:4096 t_d80_rb:4096 t_d80_sorb:4096 t_d80_w3:4096 b_d96:4096 t_d96_sorb:4096 b_d128:4096,1024 t_d128_rb:4096,1024 t_d128_so:4096,1024 t_d128_sorb:4096,1024 b_d128c:16384 t_d128c_sorb:16384 c_d80c_sorb:16384 b_d256:4096 t_d256_rb:4096 b_d64:4096 b_d128:4096; do b=${spec%%:*}; s=${spec#*:}; echo -n "$b " >> $OUT/perf.txt; timeout 12 bin/$b --perf ${s//,/ } 2>&1 | grep PERF | tr '\n' ' ' >> $OUT/perf.txt; echo >> $OUT/perf.txt; done
cat $OUT/perf.txt
