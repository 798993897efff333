#!/usr/bin/env bash
# Cold-compile cost of kernels as the instructions NVRTC executes (front end, NVVM and its ptxas),
# counted by valgrind's callgrind inside nvrtcCompileProgram only: the same count in every run, where
# wall time on a shared 2-core machine moves by ±25% (docs/perf-notes.md, session 21). Takes
# `flashjit aot` options and compiles one kernel at a time without the cache; about 150 times slower
# than a native compile (a d128 kernel: ~3 minutes).
#   bench/compile_cost.sh --head-dim 128 --causal no
# Uses $FLASHJIT_BUILD_DIR (default build); FLASHJIT_FA3_TUNING applies as usual. Needs valgrind
# (apt-get install valgrind).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${FLASHJIT_BUILD_DIR:-build}"
command -v valgrind >/dev/null || { echo "bench/compile_cost.sh needs valgrind (apt-get install valgrind)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
valgrind --tool=callgrind --toggle-collect=nvrtcCompileProgram --callgrind-out-file="$work/callgrind" \
  "$build_dir/flashjit" aot --no-cache -j 1 --out "$work/aot" "$@" 2>"$work/valgrind.log" | grep "^\[" || true
instructions=$(awk '/^(summary|totals):/ {print $2; exit}' "$work/callgrind")
[ -n "$instructions" ] || { cat "$work/valgrind.log" >&2; exit 1; }
echo "instructions executed inside nvrtcCompileProgram: $instructions"
