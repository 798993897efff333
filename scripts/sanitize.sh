#!/usr/bin/env bash
# Host code under the sanitizers (part of scripts/test.sh), in Debug builds without MLIR:
#   ${FLASHJIT_SANITIZE_BUILD_DIR:-build-sanitize}: AddressSanitizer + UndefinedBehaviorSanitizer; the
#     CPU unit tests and a `flashjit aot` -> `bundle verify` round trip;
#   the same directory with -thread appended: ThreadSanitizer; the CPU unit tests (among them the
#     kernel store used from several threads at once).
# Any report fails the run. No GPU needed (GPU code is checked by compute-sanitizer in
# scripts/gpu-check.sh --sanitize).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${FLASHJIT_SANITIZE_BUILD_DIR:-build-sanitize}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export FLASHJIT_CACHE_DIR="$work/cache"

# build DIR SANITIZERS TARGETS...: CMake takes CXXFLAGS / LDFLAGS when it first configures DIR.
build() {
  local dir=$1 sanitizers=$2
  shift 2
  CXXFLAGS="-fsanitize=$sanitizers -fno-sanitize-recover=all -fno-omit-frame-pointer" LDFLAGS="-fsanitize=$sanitizers" \
    FLASHJIT_BUILD_DIR="$dir" FLASHJIT_BUILD_TYPE=Debug \
    FLASHJIT_CMAKE_ARGS="-DFLASHJIT_WITH_MLIR=OFF -DFLASHJIT_BUILD_EXAMPLES=OFF" bash scripts/build.sh "$@"
}

build "$build_dir" address,undefined flashjit_unit_tests flashjit_cli
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
echo "== unit tests under ASan + UBSan"
"$build_dir/tests/flashjit_unit_tests" --gtest_brief=1
echo "== flashjit aot + bundle verify under ASan + UBSan"
"$build_dir/flashjit" aot --head-dim 64,80 --causal both --op prefill,decode,combine --page-size 0,16 \
  --out "$work/aot" --bundle "$work/model.fjb" -q
"$build_dir/flashjit" bundle verify "$work/model.fjb"

build "$build_dir-thread" thread flashjit_unit_tests
export TSAN_OPTIONS="halt_on_error=1"
echo "== unit tests under TSan"
FLASHJIT_CACHE_DIR="$work/cache-thread" "$build_dir-thread/tests/flashjit_unit_tests" --gtest_brief=1
echo "sanitizers: clean"
