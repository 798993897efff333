// Tuning knobs of the fa2 planner (compiler/plans/fa2_plan.cpp), for autotuning and A/B
// measurements; plan_fa2() (compiler/planner.hpp) uses the defaults.
#pragma once

#include "compiler/plan.hpp"

#include <string>

namespace flashjit {

struct Fa2Tuning {
  // 0: the planner's choice (32 up to head dim 128, else 16); 16: one m16 row block per warp; 32: two, so every K / V
  // fragment loaded from shared memory feeds two MMAs (4 warps per 128-row tile, FA-2's shape).
  int rows_per_warp = 0;
  int block_m = 0; // 0: the planner's choice; else a multiple of rows_per_warp
  int block_n = 0; // 0: the planner's choice; else a multiple of 16
  int stages = 0;  // 0: the planner's choice; else 1 (interleaved single buffer) or more (ring)
};

// The 32-rows-per-warp tiles hold O, S and P of two m16 blocks in 255 registers; with the widest key
// blocks (the fastest, perf-notes "fa2: 32 rows per warp — outcome") ptxas spills up to ~108 bytes
// (a few row statistics, L1-resident) on some archs and feature sets. Measured on the H200, d128
// 128x64 with 52 spill bytes runs 275 TFLOP/s against 247 for the spill-free 128x32, so the compile
// tests allow this much for those plans and no spill anywhere else.
constexpr int kFa2WideSpillAllowanceBytes = 128;

bool plan_fa2_tuned(const KernelSpec &spec, const Fa2Tuning &tuning, Plan *plan, std::string *why_not);

} // namespace flashjit
