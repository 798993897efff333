#!/usr/bin/env bash
# Builds the combine kernel with both backends (here, where LLVM/MLIR is) into build-device/mlir-parity,
# named <kernel>.mlir.cubin / <kernel>.nvrtc.cubin, for tests/mlir_parity/check_combine.cpp to run on the
# GPU machine (which has no LLVM). Needs a build with the MLIR backend in ${FLASHJIT_BUILD_DIR:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
cli="${FLASHJIT_BUILD_DIR:-build}/flashjit"
out=build-device/mlir-parity
rm -rf "$out" && mkdir -p "$out"
for backend in mlir nvrtc; do
  FLASHJIT_CACHE=off "$cli" aot -q --op combine --backend "$backend" --arch sm90a --head-dim 64,72,128,256 \
    --dtype bf16,fp16 --out "$out/$backend" >/dev/null
  for f in "$out/$backend"/*.cubin; do
    mv "$f" "$out/$(basename "${f%.cubin}").$backend.cubin"
  done
  rm -rf "${out:?}/$backend"
done
ls "$out" | wc -l
