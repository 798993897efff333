#!/usr/bin/env bash
# Nsight Compute profile of the kernels behind the open targets (GPU machine): fa3 d128 S4096 and S1024
# bf16 (B*S = 16384, heads*d = 2048, as compare.py's rows) and the decode rows 64x4096 and 1x32768 (Hq 32,
# Hkv 8, d 128), and cuDNN's kernels on the same shapes (cudnn_fa_d128, cudnn_fa_d128_s1024, cudnn_decode_64x4096,
# cudnn_decode_1x32768, through PyTorch). One kernel launch each, after warm-up launches, clocks left
# as the board sets them (--clock-control none). Writes RESULTS_DIR/ncu-<name>.txt with the sections
# that say what limits a kernel (speed of light, pipe utilization, warp stalls, memory) and prints a
# short summary.
#   bench/ncu_profile.sh RESULTS_DIR [NAMES (default fa3_d128,decode_64x4096,decode_1x32768)]
# NCU_SOURCE=1 adds the source-counter section and writes RESULTS_DIR/ncu-<name>-stalls.txt: the SASS
# lines with the most warp-stall samples (the report's source page, read back by bench/ncu_stalls.py),
# and RESULTS_DIR/ncu-<name>-source.csv.gz, the whole page.
# Uses $FLASHJIT_BUILD_DIR (default build-device).
set -uo pipefail
cd "$(dirname "$0")/.."
results="${1:?results directory}"
mkdir -p "$results"
build_dir="${FLASHJIT_BUILD_DIR:-build-device}"
export LD_LIBRARY_PATH="$PWD/$build_dir:${LD_LIBRARY_PATH:-}"
cli="$build_dir/flashjit"
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section MemoryWorkloadAnalysis_Tables --section SchedulerStats --section WarpStateStats
          --section InstructionStats --section LaunchStats --section Occupancy)
# Cycles per issued instruction that warps spend stalled, by reason (what WarpStateStats sums up).
stalls=""
for reason in long_scoreboard short_scoreboard barrier wait math_pipe_throttle mio_throttle lg_throttle \
  not_selected selected dispatch_stall no_instruction drain membar sleeping branch_resolving tex_throttle; do
  stalls+="${stalls:+,}smsp__average_warps_issue_stalled_${reason}_per_issue_active.ratio"
done
sections+=(--metrics "$stalls")
if [ "${NCU_SOURCE:-0}" = 1 ]; then sections+=(--section SourceCounters); fi

# NAME -> "fj COMMAND" (flashjit's kernels, fj_*) or "sdpa COMMAND" (cuDNN's, launched through PyTorch).
problem() {
  case "$1" in
  fa3_d128) echo "fj $cli bench -b 4 -s 4096 --heads-q 16 -d 128 -n 8" ;;
  fa3_d128_s1024) echo "fj $cli bench -b 16 -s 1024 --heads-q 16 -d 128 -n 8" ;;
  fa3_d128_s1024_causal) echo "fj $cli bench -b 16 -s 1024 --heads-q 16 -d 128 -n 8 --causal" ;;
  fa3_d256_s1024_causal) echo "fj $cli bench -b 16 -s 1024 --heads-q 8 -d 256 -n 8 --causal" ;;
  # Issue 3's two rows still below cuDNN (compare.py's shapes: 11 heads at d192, 32 at d64).
  fa3_d192_s1024_causal) echo "fj $cli bench -b 16 -s 1024 --heads-q 11 -d 192 -n 8 --causal" ;;
  fa3_d64_s1024_causal) echo "fj $cli bench -b 16 -s 1024 --heads-q 32 -d 64 -n 8 --causal" ;;
  # The same with advanced wgmma descriptors, which lost 1.2% there (session 36).
  fa3_d64_s1024_causal_da) echo "fj env FLASHJIT_FA3_TUNING=desc_advance=1 $cli bench -b 16 -s 1024 --heads-q 32 -d 64 -n 8 --causal" ;;
  # The odd-multiple-of-8 loss with two pingpong warpgroups (perf-notes, session 23): d104 forced onto
  # the two-warpgroup kernel against d112's, same shape rule (20 and 18 heads).
  fa3_d104_two_warpgroups) echo "fj env FLASHJIT_FA3_TUNING=consumer_warpgroups=2 $cli bench -b 4 -s 4096 --heads-q 20 -d 104 -n 8" ;;
  fa3_d112_two_warpgroups) echo "fj $cli bench -b 4 -s 4096 --heads-q 18 -d 112 -n 8" ;;
  decode_64x4096) echo "fj $cli bench -b 64 -s 1 --seqlen-k 4096 --heads-q 32 --heads-kv 8 -d 128 -n 8" ;;
  decode_1x32768) echo "fj $cli bench -b 1 -s 1 --seqlen-k 32768 --heads-q 32 --heads-kv 8 -d 128 -n 8" ;;
  # cuDNN's kernels on the same shapes (PyTorch SDPA), for what ours do differently.
  cudnn_fa_d128) echo "sdpa python3 bench/sdpa_launch.py --backend cudnn --prefill d128s4096" ;;
  cudnn_fa_d128_s1024) echo "sdpa python3 bench/sdpa_launch.py --backend cudnn --prefill d128s1024" ;;
  cudnn_fa_d128_s1024_causal) echo "sdpa python3 bench/sdpa_launch.py --backend cudnn --prefill d128s1024c" ;;
  cudnn_fa_d256_s1024_causal) echo "sdpa python3 bench/sdpa_launch.py --backend cudnn --prefill d256s1024c" ;;
  cudnn_fa_d192_s1024_causal) echo "sdpa python3 bench/sdpa_launch.py --backend cudnn --prefill d192s1024c" ;;
  cudnn_fa_d64_s1024_causal) echo "sdpa python3 bench/sdpa_launch.py --backend cudnn --prefill d64s1024c" ;;
  cudnn_decode_64x4096) echo "sdpa python3 bench/sdpa_launch.py --backend cudnn --decode 64x4096" ;;
  cudnn_decode_1x32768) echo "sdpa python3 bench/sdpa_launch.py --backend cudnn --decode 1x32768" ;;
  *) echo "unknown profile name $1" >&2; return 1 ;;
  esac
}

for name in $(echo "${2:-fa3_d128,decode_64x4096,decode_1x32768}" | tr , ' '); do
  spec=$(problem "$name") || continue
  kind=${spec%% *}
  command=${spec#* }
  if [ "$kind" = fj ]; then
    kernels="^fj_"
    $command 2>&1 | grep -iE "TFLOP|TB/s|error" | head -2 # compile (and warm the disk cache) outside the profiler
  else
    kernels="(?i)(sdpa|fmha|flash|attn|cudnn|fprop)" # cuDNN's generated kernel names
  fi
  report=()
  if [ "${NCU_SOURCE:-0}" = 1 ]; then report=(--export "/tmp/ncu-$name" --force-overwrite); fi
  # shellcheck disable=SC2086
  ncu --clock-control none --kernel-name regex:"$kernels" --launch-skip 4 --launch-count 1 "${sections[@]}" \
    "${report[@]}" $command >"$results/ncu-$name.txt" 2>&1
  if [ "${NCU_SOURCE:-0}" = 1 ]; then
    ncu --import "/tmp/ncu-$name.ncu-rep" --page source --csv --print-source sass >"/tmp/ncu-$name-source.csv" 2>&1
    python3 bench/ncu_stalls.py <"/tmp/ncu-$name-source.csv" >"$results/ncu-$name-stalls.txt" 2>&1
    # The whole source page (every SASS line, every stall reason), for reading off the machine.
    gzip -c "/tmp/ncu-$name-source.csv" >"$results/ncu-$name-source.csv.gz"
  fi
  echo "== $name"
  grep -E "^  [A-Za-z_].*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|SM Frequency|L2 Cache Throughput|Issue Slots Busy|L2 Hit Rate|Achieved Occupancy|Registers Per Thread|No Eligible|Warp Cycles Per Issued|SM Active Cycles|Elapsed Cycles" \
    "$results/ncu-$name.txt" | head -30
  grep -E "Pipe|pipe|stall|Stall" "$results/ncu-$name.txt" | head -12
  grep -E "issue_stalled" "$results/ncu-$name.txt" | sort -k3 -n -r | head -8
done
