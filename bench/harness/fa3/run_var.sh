#!/bin/bash
# Diagnostic A/B of the CTA-pair kernel (build_var.sh): c = single CTAs, A = pairs (multicast),
# B = pairs, coupled barriers, no multicast, C = cluster launch only. Correctness first, then
# interleaved timing, two rounds. Logs to $OUT.
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
for n in A_d128 B_d128 C_d128 A_d256; do
  timeout 30 bin/$n > $OUT/check_$n.log 2>&1; echo "rc=$?" >> $OUT/check_$n.log
done
grep -H "RESULT\|FAIL\|HANG\|rc=[1-9]" $OUT/check_*.log | sed 's|.*/||' > $OUT/correct.txt; cat $OUT/correct.txt
for round in 1 2; do
  for d in d128 d192 d256; do
    for v in c A B C; do
      echo -n "r$round ${v}_$d " >> $OUT/perf.txt
      timeout 30 bin/${v}_$d --perf 4096 1024 2>&1 | grep "PERF\|resident" | sed 's/PERF //;s/bf16 //;s/causal=0 //' | tr '\n' ' ' >> $OUT/perf.txt
      echo >> $OUT/perf.txt
    done
  done
done
cat $OUT/perf.txt
