#!/usr/bin/env bash
# The main job: set up, build, pre-generate kernels with `flashjit aot` (no GPU needed), and, when a
# GPU is present, run attention problems on it and check them against the float64 CPU reference.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
build_dir="${FLASHJIT_BUILD_DIR:-build}"
"$build_dir/flashjit" info
"$build_dir/flashjit" aot --arch sm80,sm90a --head-dim 64,80,128 --dtype bf16,fp16 --causal both --out "$build_dir/aot"
if "$build_dir/flashjit" info | grep -q '^gpu 0'; then
  "$build_dir/flashjit" check --batch 2 --seqlen-q 1000 --seqlen-k 1300 --heads-q 12 --heads-kv 2 --head-dim 80 --causal
  "$build_dir/flashjit" check --varlen-q 1,513,77 --varlen-k 300,600,77 --heads-q 8 --heads-kv 8 --head-dim 128 --dtype fp16
else
  echo "no GPU here: kernels were pre-generated only (run on a GPU machine to check attention too)"
fi
