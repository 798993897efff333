#!/usr/bin/env bash
# Configures and builds flashjit into ${FLASHJIT_BUILD_DIR:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${FLASHJIT_BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${FLASHJIT_BUILD_TYPE:-Release}" ${FLASHJIT_CMAKE_ARGS:-} >/dev/null
ninja -C "$build_dir" "$@"
