#!/bin/bash
# Diagnostic variants of the CTA-pair kernel (pair_variants.py): A = the templates, B = pairs
# coupled by the empty barriers but each CTA loading its whole block (no multicast), C = cluster
# launch and pair order only (own loads, own barriers); c_* (single CTAs) come from
# `build.sh configs_cl.txt`. Build here or on the device; run_var.sh times them.
set -e
cd "$(dirname "$0")"
R=${R:-$(cd .. && while [ ! -d templates ] && [ "$PWD" != / ]; do cd ..; done; pwd)}
python3 pair_variants.py "$R" "$PWD"
mkdir -p bin logs
for v in A B C; do
  tpl=$R/templates; [ $v != A ] && tpl=$PWD/tpl$v
  for d in ${DIMS:-d128 d192 d256}; do
    n=${v}_$d
    nvcc -std=c++20 -O2 -gencode arch=compute_90a,code=sm_90a -Xptxas -v -I$R -I$R/include -I$tpl -include cfg/p_$d.h \
      harness.cu obj/*.o -L/usr/local/cuda/lib64/stubs -lcuda -o bin/$n > logs/$n.build 2>&1 || { echo "BUILD FAIL $n"; tail -3 logs/$n.build; }
    grep -E "spill" logs/$n.build | sed "s/^/$n: /"
  done
done
