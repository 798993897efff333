#!/usr/bin/env bash
# Host code under AddressSanitizer + UndefinedBehaviorSanitizer (part of scripts/test.sh): a Debug
# build without MLIR in ${FLASHJIT_SANITIZE_BUILD_DIR:-build-sanitize}, then the CPU unit tests
# and a `flashjit aot` -> `bundle verify` round trip. Any report fails the run. No GPU needed (GPU
# code is checked by compute-sanitizer in scripts/gpu-check.sh --sanitize).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${FLASHJIT_SANITIZE_BUILD_DIR:-build-sanitize}"
# CMake takes CXXFLAGS / LDFLAGS when it first configures the build directory.
CXXFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
  LDFLAGS="-fsanitize=address,undefined" FLASHJIT_BUILD_DIR="$build_dir" FLASHJIT_BUILD_TYPE=Debug \
  FLASHJIT_CMAKE_ARGS="-DFLASHJIT_WITH_MLIR=OFF -DFLASHJIT_BUILD_EXAMPLES=OFF" \
  bash scripts/build.sh flashjit_unit_tests flashjit_cli
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export FLASHJIT_CACHE_DIR="$work/cache"
echo "== unit tests under ASan + UBSan"
"$build_dir/tests/flashjit_unit_tests" --gtest_brief=1
echo "== flashjit aot + bundle verify under ASan + UBSan"
"$build_dir/flashjit" aot --head-dim 64,80 --causal both --op prefill,decode,combine --page-size 0,16 \
  --out "$work/aot" --bundle "$work/model.fjb" -q
"$build_dir/flashjit" bundle verify "$work/model.fjb"
echo "sanitizers: clean"
