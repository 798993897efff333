#!/usr/bin/env bash
# Installs what flashjit needs to build and test on Debian (bookworm or later), skipping what is
# already there. The CUDA 13 toolkit itself must be present (/usr/local/cuda or $CUDA_HOME).
set -euo pipefail

cuda_root="${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}"
if [ ! -f "$cuda_root/include/nvrtc.h" ] || [ ! -f "$cuda_root/include/cuda.h" ]; then
  echo "flashjit setup: the CUDA toolkit was not found at $cuda_root (no include/nvrtc.h)." >&2
  echo "Install the CUDA 13 toolkit, or set CUDA_HOME to its root, then run this again." >&2
  exit 1
fi

# llvm-22-dev, libmlir-22-dev, mlir-22-tools: the optional MLIR backend (FLASHJIT_WITH_MLIR turns on
# when CMake finds them; the GPU machines build without).
packages=(cmake ninja-build g++ pkg-config python3 python3-pip
          libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev libxxhash-dev
          llvm-22-dev libmlir-22-dev mlir-22-tools)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "flashjit setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# cuobjdump/nvdisasm for the SASS checks, when the toolkit lacks them (only PyPI has them separately).
if ! command -v cuobjdump >/dev/null && [ ! -x "$cuda_root/bin/cuobjdump" ] &&
   ! python3 -c "import nvidia.cu13" 2>/dev/null; then
  echo "flashjit setup: installing cuobjdump/nvdisasm from PyPI"
  python3 -m pip install -q nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm 2>/dev/null ||
    python3 -m pip install -q --break-system-packages nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
fi
