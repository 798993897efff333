#!/usr/bin/env bash
# GPU machine, decode changes only: the GPU tests, then bench/compare.py's decode rows (TB/s against
# PyTorch flash and cuDNN in the same process). Results (logs, JSON) go to RESULTS_DIR.
#   scripts/gpu-decode-check.sh RESULTS_DIR [--gtest-filter=PATTERN]
set -uo pipefail
cd "$(dirname "$0")/.."
results="${1:?results directory}"
shift
filter="*"
for arg in "$@"; do
  case "$arg" in
  --gtest-filter=*) filter="${arg#--gtest-filter=}" ;;
  esac
done
mkdir -p "$results"
build_dir="${FLASHJIT_BUILD_DIR:-build-device}"
export LD_LIBRARY_PATH="$PWD/$build_dir:${LD_LIBRARY_PATH:-}"
export FLASHJIT_CACHE_DIR="${FLASHJIT_CACHE_DIR:-/tmp/flashjit-gpu-check-cache}"
"$build_dir/tests/flashjit_gpu_tests" --gtest_filter="$filter" > "$results/gpu-tests.log" 2>&1
rc=$?
grep -E "^\[  (PASSED|FAILED)|tests? ran" "$results/gpu-tests.log"
python3 bench/compare.py --lib "$build_dir/libflashjit.so" --ops decode --out "$results/bench-decode.json" 2>&1 |
  grep -v "info: \(compil\|bundle\)"
exit $rc
