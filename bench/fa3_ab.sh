#!/usr/bin/env bash
# A/B of fa3 plan choices through the runtime, on the GPU machine: for each (rows, tuning) line,
# bench/compare.py times the planner's kernel, the kernel FLASHJIT_FA3_TUNING=tuning makes, and
# PyTorch's flash and cuDNN SDPA backends on the same tensors, samples alternating. One JSON and one
# log line per row go to RESULTS_DIR.
#   bench/fa3_ab.sh RESULTS_DIR [LIST]   (LIST: lines "rows tuning" and # comments; default: the list below)
# Uses $FLASHJIT_BUILD_DIR (default build-device) for libflashjit.so; $DTYPES (default bf16,fp16). A line
# that runs past five minutes (a kernel that hangs) is stopped, and the list goes on.
set -uo pipefail
cd "$(dirname "$0")/.."
results="${1:?results directory}"
mkdir -p "$results"
build_dir="${FLASHJIT_BUILD_DIR:-build-device}"
list="${2:-}"
default_list="d64s4096 block_n=128
d128s16384c consumer_warpgroups=2
d128s1024 block_n=160
d128s4096 cluster_m=1
d80s4096,d80s16384c,d192s4096,d256s4096 lazy_rescale=0
d256s4096 pingpong=1"
i=0
while read -r rows tuning; do
  [ -z "$rows" ] || [ "${rows#\#}" != "$rows" ] && continue # blank lines and # comments
  i=$((i + 1))
  echo "== $rows with $tuning"
  timeout 300 python3 bench/compare.py --lib "$build_dir/libflashjit.so" --ops prefill --rows "$rows" --alt-tuning "$tuning" \
    --dtypes "${DTYPES:-bf16,fp16}" \
    --out "$results/ab$i.json" 2>&1 | grep -v "info: \(compil\|bundle\)"
done < <(if [ -n "$list" ]; then cat "$list"; else echo "$default_list"; fi)
