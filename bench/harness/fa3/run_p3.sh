#!/bin/bash
cd "$(dirname "$0")"; mkdir -p $OUT
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt 2>&1
for n in f_d64 f_d64c f_d80 f_d80c f_d96 f_d128 f_d32 f_d64vlc_h f_d72 f_d80lsc f_d104 f_d128vl f_d192v128 f_d96vl_h; do timeout 20 bin/$n > $OUT/$n.log 2>&1; echo "rc=$?" >> $OUT/$n.log; done
grep -H "RESULT\|FAIL\|HANG\|rc=[1-9]" $OUT/*.log | sed 's|.*/||'
for spec in b_d64:4096 f_d64:4096 b_d80:4096 f_d80:4096 b_d96:4096 f_d96:4096 b_d128:4096,1024 f_d128:4096,1024 b_d64c:16384 f_d64c:16384 b_d80c:16384 f_d80c:16384 b_d128c:16384 b_d256:4096 f_d64:4096 f_d80:4096 f_d128:4096; do b=${spec%%:*}; s=${spec#*:}; echo -n "$b " >> $OUT/perf.txt; timeout 12 bin/$b --perf ${s//,/ } 2>&1 | grep PERF | sed 's/PERF //;s/bf16 //' | tr '\n' ' ' >> $OUT/perf.txt; echo >> $OUT/perf.txt; done
cat $OUT/perf.txt; nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv >> $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
