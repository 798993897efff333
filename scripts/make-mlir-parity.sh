#!/usr/bin/env bash
# Everything the GPU machine (no LLVM) needs to check the MLIR backend against the NVRTC one, built
# here where LLVM/MLIR is, into build-device/ (carry it; make build-device first with
# scripts/pack-device.sh, from the same tree):
#   mlir-parity/          combine: <kernel>.{mlir,nvrtc}.cubin        (tests/mlir_parity/check_combine.cpp)
#   mlir-parity-decode/   decode:  <tag>.{mlir,nvrtc}.cubin + .meta    (tests/mlir_parity/check_decode.cpp)
#   mlir-parity-fa2/      fa2:     <tag>.{mlir,nvrtc}.cubin + .meta    (scripts/make-mlir-parity-fa2.sh)
#   mlir-parity-fa3/      fa3:     both backends' bundles + check_fa3   (scripts/make-mlir-parity-fa3.sh)
#   mlir-bench-*.fjb      the MLIR builds of bench/compare.py's rows, which it times beside the NVRTC
#                         ones (--mlir-bundle): decode, fa3 prefill, fa2 prefill (--variant fa2)
# scripts/gpu-check.sh runs all of it. Needs a build with the MLIR backend in ${FLASHJIT_BUILD_DIR:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${FLASHJIT_BUILD_DIR:-build}"
cli="$build/flashjit"
cuda="${CUDA_HOME:-/usr/local/cuda}"

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

out=build-device/mlir-parity-decode
rm -rf "$out" && mkdir -p "$out"
maker="$(mktemp -d)"
trap 'rm -rf "$maker"' EXIT
c++ -std=c++20 -O1 tests/mlir_parity/make_decode_parity.cpp -I. -Iinclude -Itemplates -isystem "$cuda/include" \
  -DFLASHJIT_WITH_MLIR -L"$build" -lflashjit -Wl,-rpath,"$PWD/$build" -o "$maker/make_decode_parity"
"$maker/make_decode_parity" "$out" | cut -c1-160

FLASHJIT_BUILD_DIR="$build" bash scripts/make-mlir-parity-fa2.sh >/dev/null
FLASHJIT_BUILD_DIR="$build" bash scripts/make-mlir-parity-fa3.sh >/dev/null

# bench/compare.py's rows (TARGETS.md): decode Hq 32 / Hkv 8 / d128 bf16, prefill bf16 + fp16.
rm -f build-device/mlir-bench-*.fjb
aot=(aot -q --backend mlir --arch sm90a --no-cache)
FLASHJIT_CACHE=off "$cli" "${aot[@]}" --op decode --head-dim 128 --dtype bf16 --gqa-group 4 --q-len 1 --causal no --page-size 0,16,64 \
  --out "$maker/decode" --bundle build-device/mlir-bench-decode.fjb >/dev/null
FLASHJIT_CACHE=off "$cli" "${aot[@]}" --op prefill --head-dim 64,80,96,128,192,256 --dtype bf16,fp16 \
  --out "$maker/fa3" --bundle build-device/mlir-bench-fa3.fjb >/dev/null
FLASHJIT_CACHE=off "$cli" "${aot[@]}" --op prefill --variant fa2 --head-dim 64,80,96,128,192,256 --dtype bf16 \
  --out "$maker/fa2" --bundle build-device/mlir-bench-fa2.fjb >/dev/null
for d in build-device/mlir-parity*; do echo "$d: $(ls "$d" | wc -l) files"; done
ls -la build-device/mlir-bench-*.fjb
