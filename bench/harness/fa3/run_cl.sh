#!/bin/bash
# CTA pairs (K/V multicast) against single CTAs, same binaries harness: correctness of every pair
# build (float64 reference, NaN poison, the harness's five batch cases, twice: a moving error is a
# race), then interleaved timing c/p/c/p at S = 4096 and 1024 (B*S = 16384, H*d = 2048). Logs to $OUT.
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt 2>&1
for n in p_d128 p_d128h p_d136 p_d192 p_d192v128 p_d256 p_d256sc p_d128 c_d128; do
  timeout 30 bin/$n > $OUT/$n.log 2>&1; echo "rc=$?" >> $OUT/$n.log
done
grep -H "RESULT\|FAIL\|HANG\|rc=[1-9]" $OUT/*.log | sed 's|.*/||' > $OUT/correct.txt; cat $OUT/correct.txt
for round in 1 2; do
  for d in d128 d192 d256; do
    for v in c p; do
      echo -n "r$round ${v}_$d " >> $OUT/perf.txt
      timeout 30 bin/${v}_$d --perf 4096 1024 2>&1 | grep PERF | sed 's/PERF //;s/bf16 //' | tr '\n' ' ' >> $OUT/perf.txt
      echo >> $OUT/perf.txt
    done
  done
done
cat $OUT/perf.txt; nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv >> $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
