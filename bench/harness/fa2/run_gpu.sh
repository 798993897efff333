#!/bin/bash
# fa2perf on the H200: correctness of the 32-rows-per-warp configuration (float64 reference, NaN-
# poisoned outputs, every element; head dims 8..256, causal / window / softcap / varlen / paged /
# GQA / unaligned), then timing of default vs 32 rows at d64/d80/d128 bf16 S=4096, then PyTorch's
# FA-2 at the same shapes. The cfg_*.cu were generated on the CPU by gen_configs (plan_fa2_tuned).
# Usage (repo root): bash .scratch/fa2perf/run_gpu.sh   -> logs in $OUT (or .scratch/fa2perf/out)
set -u
cd "$(dirname "$0")"
LOG=${OUT:-$PWD/out}
mkdir -p "$LOG"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$LOG/gpu.txt" 2>&1
# The harness is prebuilt on the CPU (build.sh, sm_90a, static cudart); REBUILD=1 rebuilds it here.
if [ ! -x harness ] || [ "${REBUILD:-0}" = 1 ]; then
  rm -f cfg_*.o harness.o harness
  JOBS=16 bash build.sh > "$LOG/build.log" 2>&1 || { echo "BUILD FAILED"; tail -50 "$LOG/build.log"; exit 1; }
fi
grep -h "registers\|spill" ptxas_cfg_*.log > "$LOG/ptxas.txt" 2>/dev/null
timeout 150 ./harness > "$LOG/harness.log" 2>&1; echo "harness rc=$?" >> "$LOG/harness.log"
timeout 60 python3 torch_fa2.py > "$LOG/torch.log" 2>&1; echo "torch rc=$?" >> "$LOG/torch.log"
grep -c "^PASS" "$LOG/harness.log" | sed 's/^/PASS cases: /'
grep "^FAIL\|SUMMARY\|rc=" "$LOG/harness.log"
grep "^PERF" "$LOG/harness.log"
cat "$LOG/torch.log"
