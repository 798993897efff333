#!/usr/bin/env bash
# Builds the flashjit CLI with the MLIR backend into build-static/, with LLVM/MLIR linked statically
# into libflashjit.so (FLASHJIT_MLIR_STATIC), and puts stripped copies of the two files into
# build-static/bin/: carry that folder to a machine without LLVM (the CLI finds libflashjit.so.0
# beside itself through its $ORIGIN run path). Prints sizes and ldd; fails if LLVM/MLIR is needed.
#   scripts/build-static-cli.sh [ninja targets...]   (default: flashjit_cli; FLASHJIT_JOBS=2)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=build-static
carry_dir="$build_dir/bin"
FLASHJIT_BUILD_DIR="$build_dir" FLASHJIT_CMAKE_ARGS="-DFLASHJIT_WITH_MLIR=ON -DFLASHJIT_MLIR_STATIC=ON \
  -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON ${FLASHJIT_CMAKE_ARGS:-}" \
  bash scripts/build.sh -j "${FLASHJIT_JOBS:-2}" "${@:-flashjit_cli}"

# Plain files, no symlinks: the CLI needs libflashjit.so.0 by its soname.
lib=$(readlink -f "$build_dir/libflashjit.so")
mkdir -p "$carry_dir"
strip -o "$carry_dir/flashjit" "$build_dir/flashjit"
# --strip-unneeded keeps the library's dynamic symbols (the CLI links against them).
strip --strip-unneeded -o "$carry_dir/libflashjit.so.0" "$lib"
echo "== unstripped"
du -h "$build_dir/flashjit" "$lib"
echo "== stripped, in $carry_dir (carry this folder)"
du -h "$carry_dir/flashjit" "$carry_dir/libflashjit.so.0"
du -sh "$carry_dir"
for file in "$carry_dir/flashjit" "$carry_dir/libflashjit.so.0"; do
  echo "== ldd $file"
  ldd "$file"
  if ldd "$file" | grep -E 'libLLVM|libMLIR'; then
    echo "error: $file still needs a shared LLVM/MLIR" >&2
    exit 1
  fi
done
