#!/usr/bin/env bash
# The whole test suite: CPU unit tests, compile tests (NVRTC + ptxas, no GPU needed) and GPU tests
# (which skip, loudly, without a GPU); then the host code under ASan + UBSan (scripts/sanitize.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
build_dir="${FLASHJIT_BUILD_DIR:-build}"
export FLASHJIT_CACHE_DIR="${FLASHJIT_CACHE_DIR:-$PWD/$build_dir/test-cache}"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "$@"
bash scripts/sanitize.sh
