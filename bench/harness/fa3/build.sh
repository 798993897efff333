#!/bin/bash
# Builds one harness binary per config: name dqk dv bf16 causal local softcap varlen
set -e
cd "$(dirname "$0")"
# The repository root: two levels up from .scratch/<name>, three from bench/harness/fa3.
R=${R:-$(cd .. && while [ ! -d templates ] && [ "$PWD" != / ]; do cd ..; done; pwd)}
mkdir -p bin obj cfg
CXXF="-std=c++20 -O2 -I$R -I$R/include -I$R/templates -isystem /usr/local/cuda/include"
for src in runtime/tma_desc.cpp compiler/spec.cpp compiler/plans/fa3_plan.cpp; do
  o=obj/$(basename $src .cpp).o; [ $R/$src -nt $o ] && g++ $CXXF -c $R/$src -o $o || true
done
build_one() {
  name=$1; shift
  ./gen_config "$@" > cfg/$name.h 2>/dev/null || { echo "PLAN FAIL $name"; return; }
  nvcc -std=c++20 -O2 -gencode arch=compute_90a,code=sm_90a -Xptxas -v -I$R -I$R/include -I$R/templates -include cfg/$name.h \
    harness.cu obj/*.o -L/usr/local/cuda/lib64/stubs -lcuda -o bin/$name > logs/$name.build 2>&1 || { echo "BUILD FAIL $name"; tail -5 logs/$name.build; }
  grep -E "registers|spill|C75|error" logs/$name.build | sed "s/^/$name: /" | grep -v "0 bytes gmem" | head -6
}
mkdir -p logs
while read -r line; do
  [ -z "$line" ] && continue
  build_one $line &
  while [ $(jobs -r | wc -l) -ge 2 ]; do sleep 0.5; done
done < "${1:-configs.txt}"
wait
