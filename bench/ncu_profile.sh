#!/usr/bin/env bash
# Nsight Compute profile of the kernels behind the open targets (GPU machine): fa3 d128 S4096 bf16
# (B*S = 16384, heads*d = 2048, as compare.py's row) and the decode rows 64x4096 and 1x32768 (Hq 32,
# Hkv 8, d 128). One kernel launch each, after warm-up launches, clocks left as the board sets them
# (--clock-control none). Writes RESULTS_DIR/ncu-<name>.txt with the sections that say what limits a
# kernel (speed of light, pipe utilization, warp stalls, memory) and prints a short summary.
#   bench/ncu_profile.sh RESULTS_DIR [NAMES (default fa3_d128,decode_64x4096,decode_1x32768)]
# Uses $FLASHJIT_BUILD_DIR (default build-device).
set -uo pipefail
cd "$(dirname "$0")/.."
results="${1:?results directory}"
mkdir -p "$results"
build_dir="${FLASHJIT_BUILD_DIR:-build-device}"
export LD_LIBRARY_PATH="$PWD/$build_dir:${LD_LIBRARY_PATH:-}"
cli="$build_dir/flashjit"
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section SchedulerStats --section WarpStateStats --section InstructionStats --section LaunchStats
          --section Occupancy)

problem() {
  case "$1" in
  fa3_d128) echo "-b 4 -s 4096 --heads-q 16 -d 128" ;;
  decode_64x4096) echo "-b 64 -s 1 --seqlen-k 4096 --heads-q 32 --heads-kv 8 -d 128" ;;
  decode_1x32768) echo "-b 1 -s 1 --seqlen-k 32768 --heads-q 32 --heads-kv 8 -d 128" ;;
  *) echo "unknown profile name $1" >&2; return 1 ;;
  esac
}

for name in $(echo "${2:-fa3_d128,decode_64x4096,decode_1x32768}" | tr , ' '); do
  args=$(problem "$name") || continue
  # Compile (and warm the disk cache) outside the profiler.
  "$cli" bench $args -n 3 2>&1 | grep -iE "TFLOP|TB/s|error" | head -2
  # shellcheck disable=SC2086
  ncu --clock-control none --kernel-name regex:"^fj_" --launch-skip 4 --launch-count 1 "${sections[@]}" \
    "$cli" bench $args -n 8 >"$results/ncu-$name.txt" 2>&1
  echo "== $name"
  grep -E "^  [a-z_]+ |Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|SM Frequency|DRAM Frequency|Issue Slots Busy|Issued Ipc Active|Executed Ipc Active|L2 Hit Rate|L1/TEX Hit Rate|Achieved Occupancy|Registers Per Thread|No Eligible|Warp Cycles Per Issued" \
    "$results/ncu-$name.txt" | head -30
  grep -E "Pipe|pipe|stall|Stall" "$results/ncu-$name.txt" | head -12
done
