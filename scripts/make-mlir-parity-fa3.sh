#!/usr/bin/env bash
# Makes what the GPU machine needs for the fa3 MLIR-vs-NVRTC parity check, into
# build-device/mlir-parity-fa3/ (carry build-device):
#   fa3-mlir.fjb, fa3-nvrtc.fjb  the kernels of tests/mlir_parity/fa3_cases.hpp built with each backend
#                                (tests/mlir_parity/make_fa3_bundle.cpp, here, where LLVM/MLIR is);
#   check_fa3                    tests/mlir_parity/check_fa3.cpp linked against build-device's library
#                                (no LLVM), which serves each bundle through the normal launch path.
# Needs a build with the MLIR backend in ${FLASHJIT_BUILD_DIR:-build} and build-device from the same
# tree (scripts/pack-device.sh): the device's library refuses bundles built from other kernel sources.
# On the GPU machine:  build-device/mlir-parity-fa3/check_fa3 build-device/mlir-parity-fa3
set -euo pipefail
cd "$(dirname "$0")/.."
build="${FLASHJIT_BUILD_DIR:-build}"
device="${FLASHJIT_DEVICE_BUILD_DIR:-build-device}"
cuda="${CUDA_HOME:-/usr/local/cuda}"
out="$device/mlir-parity-fa3"
for need in "$build/libflashjit.so" "$device/libflashjit.so" "$device/libflashjit_harness.a" "$device/flashjit"; do
  [ -e "$need" ] || { echo "missing $need (see the header of $0)" >&2; exit 1; }
done
rm -rf "$out" && mkdir -p "$out"
flags=(-std=c++20 -O2 -I. -Iinclude -Itemplates -Itests -isystem "$cuda/include")

c++ "${flags[@]}" -DFLASHJIT_WITH_MLIR tests/mlir_parity/make_fa3_bundle.cpp -o "$out/make_fa3_bundle" \
  -L"$build" -lflashjit -Wl,-rpath,"$PWD/$build"
"$out/make_fa3_bundle" "$out" "$cuda/bin/ptxas"
rm -rf "${out:?}/ptx" "$out/make_fa3_bundle"

c++ "${flags[@]}" tests/mlir_parity/check_fa3.cpp -o "$out/check_fa3" "$device/libflashjit_harness.a" \
  "$device/libflashjit_reference.a" -L"$device" -lflashjit -Wl,-rpath,'$ORIGIN/..'

# The device's own library checks format, kernel sources and every checksum.
for bundle in "$out"/fa3-mlir.fjb "$out"/fa3-nvrtc.fjb; do
  LD_LIBRARY_PATH="$device" "$device/flashjit" bundle verify "$bundle"
done
ls -la "$out"
