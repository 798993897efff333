#!/usr/bin/env bash
# GPU machine: run the GPU tests, example checks and (optionally) the benchmark; logs and JSON go to
# the results directory given as $1 (default: gpu-results). Uses binaries from $FLASHJIT_BUILD_DIR
# (default build-device, e.g. built elsewhere and carried) or builds them here when absent.
#   scripts/gpu-check.sh RESULTS_DIR [--bench] [--sanitize] [--no-tests] [--no-parity] [--gtest-filter=PATTERN]
#                        [--test-jobs=N] [--test-timeout=SECONDS]
# The GPU tests run as N gtest shards at once (default 6): most of their time is NVRTC compiling
# one kernel after another, which the GPU machine's cores do side by side. Each shard is killed
# after SECONDS (default 420), so a kernel that hangs costs that much, not the whole lease.
# It leaves at most 8 files in RESULTS_DIR (what the GPU machine's tool hands back).
set -uo pipefail
cd "$(dirname "$0")/.."
results="${1:-gpu-results}"
shift || true
mkdir -p "$results"
results="$(cd "$results" && pwd)"
build_dir="${FLASHJIT_BUILD_DIR:-build-device}"
bench=0
sanitize=0
parity=1
filter="*"
test_jobs=6
test_timeout=420
for arg in "$@"; do
  case "$arg" in
  --bench) bench=1 ;;
  --sanitize) sanitize=1 ;;
  --no-tests) filter="-*" ;;
  --no-parity) parity=0 ;;
  --gtest-filter=*) filter="${arg#--gtest-filter=}" ;;
  --test-jobs=*) test_jobs="${arg#--test-jobs=}" ;;
  --test-timeout=*) test_timeout="${arg#--test-timeout=}" ;;
  esac
done

if [ ! -x "$build_dir/flashjit" ]; then
  echo "== building in $build_dir"
  FLASHJIT_BUILD_DIR="$build_dir" bash scripts/build.sh 2>&1 | tail -20
fi
export LD_LIBRARY_PATH="$PWD/$build_dir:${LD_LIBRARY_PATH:-}"
export FLASHJIT_CACHE_DIR="${FLASHJIT_CACHE_DIR:-/tmp/flashjit-gpu-check-cache}"
export FLASHJIT_LOG="${FLASHJIT_LOG:-info}"

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
  "$build_dir/flashjit" info 2>&1
} | tee "$results/info.txt"

echo "== GPU tests ($test_jobs shards, ${test_timeout} s each at most)"
shard_dir="$(mktemp -d)"
shard_pids=()
for ((shard = 0; shard < test_jobs; ++shard)); do
  GTEST_TOTAL_SHARDS=$test_jobs GTEST_SHARD_INDEX=$shard timeout -k 10 "$test_timeout" \
    "$build_dir/tests/flashjit_gpu_tests" --gtest_filter="$filter" >"$shard_dir/$shard.log" 2>&1 &
  shard_pids+=($!)
done
gpu_rc=0
for pid in "${shard_pids[@]}"; do
  wait "$pid" || gpu_rc=1
done
for ((shard = 0; shard < test_jobs; ++shard)); do
  echo "=== shard $shard of $test_jobs"
  cat "$shard_dir/$shard.log"
  # A shard killed by the timeout printed no summary: name the test it was in.
  grep -qE "^\[==========\] .* ran\." "$shard_dir/$shard.log" ||
    echo "[  FAILED  ] shard $shard stopped (timeout or crash) in: $(grep -E '^\[ RUN' "$shard_dir/$shard.log" | tail -1)"
done >"$results/gpu-tests.log"
rm -rf "$shard_dir"
# Per shard: its totals, and every failed or stopped test (skipped ones are listed in the log).
grep -E "^=== shard|^\[==========\] .* ran\.|^\[  (PASSED|SKIPPED) \] [0-9]|^\[  FAILED  \] [A-Za-z]" "$results/gpu-tests.log"

echo "== CLI checks"
{
  "$build_dir/flashjit" check --batch 2 --seqlen-q 1000 --seqlen-k 1300 --heads-q 12 --heads-kv 2 --head-dim 80 --causal
  "$build_dir/flashjit" check --varlen-q 1,513,77 --varlen-k 300,600,77 --heads-q 8 --head-dim 128 --dtype fp16
} 2>&1 | tee "$results/cli-check.txt" | grep -E "PASS|FAIL|error"

if [ "$sanitize" = 1 ] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer"
  # Each run stopped after 150 s: a kernel that hangs under the tool must not take the lease.
  sanitizer() { timeout -k 10 150 compute-sanitizer "$@" || echo "compute-sanitizer $*: exit $?"; }
  # The planner's kernel (fa3 on Hopper), then fa2 forced (its K/V stream copy, paged and unaligned
  # paths are exercised by the second and third problems).
  for variant in auto fa2; do
    for tool in memcheck racecheck; do
      echo "--- $tool ($variant)"
      FLASHJIT_VARIANT=$variant sanitizer --tool "$tool" "$build_dir/flashjit" check --varlen-q 1,130,77 \
        --varlen-k 64,200,77 --heads-q 4 --head-dim 128 --causal 2>&1
    done
  done > "$results/sanitizer.txt"
  for tool in memcheck racecheck; do
    echo "--- $tool (fa3 CTA pairs: d128 non-causal, 3 m-blocks, GQA 2)"
    sanitizer --tool "$tool" "$build_dir/flashjit" check --batch 1 --seqlen-q 300 --seqlen-k 333 \
      --heads-q 4 --heads-kv 2 --head-dim 128 2>&1
  done >> "$results/sanitizer.txt"
  for tool in memcheck racecheck; do
    echo "--- $tool (fa3 drawn tiles: d192 causal, 288 tiles drawn by 132 walkers from the workspace's counter)"
    sanitizer --tool "$tool" "$build_dir/flashjit" check --batch 2 --seqlen-q 700 --seqlen-k 900 \
      --heads-q 24 --heads-kv 4 --head-dim 192 --causal 2>&1
  done >> "$results/sanitizer.txt"
  for tool in memcheck racecheck; do
    echo "--- $tool (fa3 tail split: d128, 160 units on 66 walkers, cut tiles merged through the workspace)"
    sanitizer --tool "$tool" "$build_dir/flashjit" check --batch 1 --seqlen-q 1000 --seqlen-k 2600 \
      --heads-q 40 --heads-kv 8 --head-dim 128 2>&1
  done >> "$results/sanitizer.txt"
  for tool in memcheck racecheck; do
    echo "--- $tool (fa3 paged: d128 causal varlen, 16-key pages in TMA boxes, V rows past the ends zeroed)"
    FLASHJIT_FA3_TUNING=paged=1 sanitizer --tool "$tool" "$build_dir/flashjit" check --varlen-q 1,130,77 \
      --varlen-k 64,200,77 --heads-q 4 --head-dim 128 --causal --page-size 16 --strict 2>&1
    echo "--- $tool (fa3 paged: the same with 64-key pages, key blocks of whole pages, lazy rescaling's top rounding)"
    FLASHJIT_FA3_TUNING=paged=1 sanitizer --tool "$tool" "$build_dir/flashjit" check --varlen-q 1,130,77 \
      --varlen-k 64,200,77 --heads-q 4 --head-dim 80 --causal --page-size 64 --strict 2>&1
    echo "--- $tool (fa3 paged: the same with 3-key pages, gathered by cp.async)"
    FLASHJIT_FA3_TUNING=paged=1 sanitizer --tool "$tool" "$build_dir/flashjit" check --varlen-q 1,130,77 \
      --varlen-k 64,200,77 --heads-q 4 --head-dim 128 --causal --page-size 3 --strict 2>&1
  done >> "$results/sanitizer.txt"
  for tool in memcheck racecheck; do
    echo "--- $tool (fa2, 80-dim, sq < sk)"
    FLASHJIT_VARIANT=fa2 sanitizer --tool "$tool" "$build_dir/flashjit" check --batch 2 --seqlen-q 70 \
      --seqlen-k 333 --heads-q 6 --heads-kv 2 --head-dim 80 --causal 2>&1
  done >> "$results/sanitizer.txt"
  grep -E "^---|SUMMARY" "$results/sanitizer.txt"
fi

# MLIR vs NVRTC (scripts/make-mlir-parity.sh made the kernels where LLVM is): every checker appends
# to one file; each prints PASS/FAIL per case against the float64 reference and the bit differences.
if [ "$parity" = 1 ] && [ -d "$build_dir/mlir-parity" ]; then
  echo "== MLIR vs NVRTC parity"
  parity="$results/mlir-parity.txt"
  : >"$parity"
  tools="$(mktemp -d)"
  g++ -std=c++17 -O2 tests/mlir_parity/check_combine.cpp -I. -I/usr/local/cuda/include -Itemplates -lcuda \
    -o "$tools/check_combine" 2>&1 | tail -5
  for f in "$build_dir"/mlir-parity/*.mlir.cubin; do
    base="${f%.mlir.cubin}"
    dtype=$(basename "$base" | cut -d. -f5)
    dv=$(basename "$base" | cut -d. -f4 | tr -d v)
    echo "-- combine $(basename "$base")"
    "$tools/check_combine" "$base" "$dtype" "$dv" 16
  done >>"$parity" 2>&1
  if [ -d "$build_dir/mlir-parity-decode" ]; then
    g++ -std=c++20 -O2 tests/mlir_parity/check_decode.cpp compiler/splitk_schedule.cpp -I. -Itemplates \
      -I/usr/local/cuda/include -lcuda -o "$tools/check_decode" 2>&1 | tail -5
    for m in "$build_dir"/mlir-parity-decode/*.meta; do
      echo "-- decode $(basename "${m%.meta}")"
      "$tools/check_decode" "${m%.meta}"
    done >>"$parity" 2>&1
  fi
  if [ -d "$build_dir/mlir-parity-fa2" ]; then
    g++ -std=c++17 -O2 tests/mlir_parity/check_fa2.cpp -I. -Itemplates -I/usr/local/cuda/include -lcuda \
      -o "$tools/check_fa2" 2>&1 | tail -5
    for m in "$build_dir"/mlir-parity-fa2/*.meta; do
      echo "-- fa2 $(basename "${m%.meta}")"
      "$tools/check_fa2" "${m%.meta}"
    done >>"$parity" 2>&1
  fi
  if [ -x "$build_dir/mlir-parity-fa3/check_fa3" ]; then
    echo "-- fa3" >>"$parity"
    "$build_dir/mlir-parity-fa3/check_fa3" "$build_dir/mlir-parity-fa3" >>"$parity" 2>&1
  fi
  rm -rf "$tools"
  grep -cE "PASS" "$parity" | sed 's/^/parity PASS lines: /'
  grep -E "FAIL|error|refused|TFLOP/s|ratio" "$parity" | head -40
  # A failed case, or a kernel bundle refused (e.g. made before the templates changed: rerun
  # scripts/make-mlir-parity.sh), fails the check as a failed test does.
  if grep -qE "FAIL|refused" "$parity"; then
    echo "MLIR parity: failed or not run (see above)"
    gpu_rc=1
  fi
fi

if [ "$bench" = 1 ] && [ -x "$build_dir/flashjit_host_bench" ]; then
  echo "== host overhead"
  "$build_dir/flashjit_host_bench" --benchmark_out="$results/host.json" --benchmark_out_format=json 2>&1 |
    grep -E "forward|launch|resolve|context|prepare_disk|validate|decode"
fi

if [ "$bench" = 1 ]; then
  echo "== benchmark"
  # The MLIR builds of the same rows, timed beside the NVRTC ones (issue 5), where they were made.
  mlir_main=$(ls "$build_dir"/mlir-bench-fa3.fjb "$build_dir"/mlir-bench-decode.fjb 2>/dev/null | paste -sd, -)
  mlir_fa2=$(ls "$build_dir"/mlir-bench-fa2.fjb 2>/dev/null || true)
  python3 bench/compare.py --lib "$build_dir/libflashjit.so" --out "$results/bench.json" \
    ${mlir_main:+--mlir-bundle "$mlir_main"} 2>&1 | grep -v "info: \(compil\|bundle\)"
  echo "== benchmark, fa2 forced (issue 2: fa2 against PyTorch's FA-2)"
  python3 bench/compare.py --lib "$build_dir/libflashjit.so" --variant fa2 --ops prefill --dtypes bf16 \
    --out "$results/bench-fa2.json" ${mlir_fa2:+--mlir-bundle "$mlir_fa2"} 2>&1 | grep -v "info: \(compil\|bundle\)"
fi
exit $gpu_rc
