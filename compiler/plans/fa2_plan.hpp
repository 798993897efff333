// Tuning knobs of the fa2 planner (compiler/plans/fa2_plan.cpp), for autotuning and A/B
// measurements; plan_fa2() (compiler/planner.hpp) uses the defaults.
#pragma once

#include "compiler/plan.hpp"

#include <flashjit/flashjit.h>

#include <string>

namespace flashjit {

struct Fa2Tuning {
  // 0: the planner's choice (32 up to head dim 128, else 16); 16: one m16 row block per warp; 32: two, so every K / V
  // fragment loaded from shared memory feeds two MMAs (4 warps per 128-row tile, FA-2's shape).
  int rows_per_warp = 0;
  int block_m = 0; // 0: the planner's choice; else a multiple of rows_per_warp
  int block_n = 0; // 0: the planner's choice; else a multiple of 16
  int stages = 0;  // 0: the planner's choice; else 1 (interleaved single buffer) or more (ring)
  // 0: the planner's choice; else the keys of one QK -> softmax -> PV step, a multiple of 16 that
  // divides block_n (ring schedule only; one stage always uses block_n).
  int sub_block_n = 0;
};

bool plan_fa2_tuned(const KernelSpec &spec, const Fa2Tuning &tuning, Plan *plan, std::string *why_not,
                    flashjit_backend backend = FLASHJIT_BACKEND_AUTO);

} // namespace flashjit
