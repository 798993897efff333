#!/usr/bin/env bash
# SM clock and board power while one kernel runs back to back (GPU machine): for each head dim,
# `flashjit bench` (B*S = 16384 at S = 4096, heads*d = 2048) runs N launches while nvidia-smi
# samples every 50 ms; prints TFLOP/s with the median SM clock, power and throttle reasons of the
# samples taken during the launches. Run 12c took every sample with 3000 launches and read idle power.
#   bench/clock_probe.sh [HEAD_DIMS (default 64,128,256)] [ITERATIONS (default 8000)]
# Uses $FLASHJIT_BUILD_DIR (default build-device).
set -uo pipefail
cd "$(dirname "$0")/.."
build_dir="${FLASHJIT_BUILD_DIR:-build-device}"
export LD_LIBRARY_PATH="$PWD/$build_dir:${LD_LIBRARY_PATH:-}"
samples=$(mktemp)
for d in $(echo "${1:-64,128,256}" | tr , ' '); do
  for dtype in bf16 fp16; do
    heads=$((2048 / d))
    nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader,nounits \
      -lms 50 >"$samples" &
    smi=$!
    result=$("$build_dir/flashjit" bench -b 4 -s 4096 --heads-q "$heads" -d "$d" --dtype "$dtype" -n "${2:-8000}" 2>&1 |
      grep -iE "TFLOP" | head -1)
    kill "$smi" 2>/dev/null
    wait "$smi" 2>/dev/null
    # Only the samples taken while the kernel loop ran: board power above 60% of the run's peak
    # (the compile, input generation and the float64 check draw near-idle power); medians by sort.
    peak=$(cut -d, -f2 "$samples" | tr -d ' ' | sort -n | tail -1)
    middle=$(awk -F', ' -v peak="$peak" '$2 + 0 > 0.6 * peak' "$samples")
    m=$(echo "$middle" | grep -c .)
    median() { echo "$middle" | cut -d, -f"$1" | tr -d ' ' | sort -n | sed -n "$(((m + 1) / 2))p"; }
    reasons=$(echo "$middle" | cut -d, -f3 | tr -d ' ' | sort | uniq -c | awk '{printf "%sx%s ", $2, $1}')
    summary="sm clock $(median 1) MHz, power $(median 2) W, throttle reasons ${reasons}($m samples)"
    echo "d$d $dtype: $result | $summary"
  done
done
rm -f "$samples"
