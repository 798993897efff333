#!/usr/bin/env bash
# Builds the binaries the GPU machine runs (it has no GoogleTest, CLI11 or Google Benchmark) into
# build-device/, with the one shared library they need beside them, so the folder can be carried.
set -euo pipefail
cd "$(dirname "$0")/.."
FLASHJIT_BUILD_DIR=build-device FLASHJIT_CMAKE_ARGS="-DFLASHJIT_WITH_MLIR=OFF ${FLASHJIT_CMAKE_ARGS:-}" bash scripts/build.sh
lib=$(ldd build-device/flashjit_host_bench 2>/dev/null | awk '/libbenchmark/ {print $3}')
if [ -n "$lib" ] && [ ! -e "build-device/$(basename "$lib")" ]; then cp -L "$lib" build-device/; fi
du -sh build-device
