#!/bin/bash
# Device run of the key-balanced schedule (compiler/splitk_schedule): the correctness cases of
# `harness check` (long rows are cut mid-tile and mid-page), then `harness ab` (tiles vs keys vs keys
# without the piece charge, four TARGETS shapes x contiguous / page 16 / page 64). Logs go to $OUT.
#   prepare (any machine with the toolkit): bash bench/harness/decode/run_ab.sh DIR --prepare
#   device (from the repo root, DIR carried): bash bench/harness/decode/run_ab.sh DIR
set -u
src="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$src/../../.." && pwd)"
dir="${1:-.scratch/decode_keys}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
cuda="${CUDA_HOME:-/usr/local/cuda}"
build() {
  g++ -std=c++20 -O2 -I"$root" -I"$root/templates" -I"$cuda/include" "$src/harness.cpp" \
    "$root/compiler/splitk_schedule.cpp" -L"$cuda/lib64/stubs" -lcuda -lpthread -static-libstdc++ -static-libgcc \
    -o "$dir/harness"
}
if [ "${2:-}" = "--prepare" ]; then
  g++ -std=c++20 -O1 -DFLASHJIT_SOURCE_DIR=\""$root"\" -I"$root" -I"$root/include" -I"$root/templates" \
    -I"$cuda/include" "$src/gen.cpp" "$root/compiler/plan.cpp" "$root/compiler/spec.cpp" "$root/compiler/codegen.cpp" \
    "$root/compiler/plans/decode_plan.cpp" -L"$cuda/lib64" -lnvrtc -lxxhash -Wl,-rpath,"$cuda/lib64" -o "$dir/gen" &&
    rm -rf "$dir/cubins_h" && "$dir/gen" "$dir/cubins_h" "$src/harness_specs.txt" > "$dir/gen.log" 2>&1 && build
  tail -1 "$dir/gen.log"
  exit $?
fi
out="${OUT:-$dir}"
# The harness was built where it was prepared; rebuild it here if it does not start.
"$dir/harness" "$dir/cubins_h" none > /dev/null 2>&1 || build
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
timeout 240 "$dir/harness" "$dir/cubins_h" check > "$out/check.log" 2>&1
echo "rc=$?" >> "$out/check.log"
timeout 300 "$dir/harness" "$dir/cubins_h" ab > "$out/ab.log" 2>&1
echo "rc=$?" >> "$out/ab.log"
grep -hE "^(FAIL|CHECK|AB)|failures|rc=" "$out/check.log" "$out/ab.log"
