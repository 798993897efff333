#!/usr/bin/env bash
# GPU machine: run the GPU tests, example checks and (optionally) the benchmark; logs and JSON go to
# the results directory given as $1 (default: gpu-results). Uses binaries from $FLASHJIT_BUILD_DIR
# (default build-device, e.g. built elsewhere and carried) or builds them here when absent.
#   scripts/gpu-check.sh RESULTS_DIR [--bench] [--sanitize] [--no-tests] [--gtest-filter=PATTERN]
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
filter="*"
for arg in "$@"; do
  case "$arg" in
  --bench) bench=1 ;;
  --sanitize) sanitize=1 ;;
  --no-tests) filter="-*" ;;
  --gtest-filter=*) filter="${arg#--gtest-filter=}" ;;
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

echo "== GPU tests"
"$build_dir/tests/flashjit_gpu_tests" --gtest_filter="$filter" \
  > "$results/gpu-tests.log" 2>&1
gpu_rc=$?
grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests ran" "$results/gpu-tests.log" | tail -40

echo "== CLI checks"
{
  "$build_dir/flashjit" check --batch 2 --seqlen-q 1000 --seqlen-k 1300 --heads-q 12 --heads-kv 2 --head-dim 80 --causal
  "$build_dir/flashjit" check --varlen-q 1,513,77 --varlen-k 300,600,77 --heads-q 8 --head-dim 128 --dtype fp16
} 2>&1 | tee "$results/cli-check.txt" | grep -E "PASS|FAIL|error"

if [ "$sanitize" = 1 ] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer"
  for tool in memcheck racecheck; do
    echo "--- $tool"
    compute-sanitizer --tool "$tool" "$build_dir/flashjit" check --varlen-q 1,130,77 --varlen-k 64,200,77 --heads-q 4 \
      --head-dim 128 --causal 2>&1
  done > "$results/sanitizer.txt"
  grep -E "^---|SUMMARY" "$results/sanitizer.txt"
fi

if [ -d "$build_dir/mlir-parity" ]; then
  echo "== MLIR vs NVRTC combine parity"
  g++ -std=c++17 -O2 tests/mlir_parity/check_combine.cpp -I/usr/local/cuda/include -Itemplates -lcuda \
    -o "$results/check_combine" 2>&1 | tail -5
  for f in "$build_dir"/mlir-parity/*.mlir.cubin; do
    base="${f%.mlir.cubin}"
    dtype=$(basename "$base" | cut -d. -f5)
    dv=$(basename "$base" | cut -d. -f4 | tr -d v)
    "$results/check_combine" "$base" "$dtype" "$dv" 16
  done 2>&1 | tee "$results/mlir-parity.txt" | grep -E "PASS|FAIL|differ" | head -40
  rm -f "$results/check_combine"
fi

if [ "$bench" = 1 ] && [ -x "$build_dir/flashjit_host_bench" ]; then
  echo "== host overhead"
  "$build_dir/flashjit_host_bench" --benchmark_out="$results/host.json" --benchmark_out_format=json 2>&1 |
    grep -E "forward|launch|prepare_disk|validate|decode"
fi

if [ "$bench" = 1 ]; then
  echo "== benchmark"
  python3 bench/compare.py --lib "$build_dir/libflashjit.so" --out "$results/bench.json" 2>&1 | grep -v "info: compil"
  echo "== benchmark, fa2 forced (issue 2: fa2 against PyTorch's FA-2)"
  python3 bench/compare.py --lib "$build_dir/libflashjit.so" --variant fa2 --ops prefill --dtypes bf16 \
    --out "$results/bench-fa2.json" 2>&1 | grep -v "info: compil"
fi
exit $gpu_rc
