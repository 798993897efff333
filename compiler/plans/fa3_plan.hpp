// Tuning knobs of the fa3 planner (compiler/plans/fa3_plan.cpp), for autotuning and A/B
// measurements; plan_fa3() (compiler/planner.hpp) uses the defaults.
#pragma once

#include "compiler/plan.hpp"

#include <string>

namespace flashjit {

struct Fa3Tuning {
  int block_n = 0;          // 0: the planner's choice; else a multiple of 16 that must fit
  int pingpong = -1;        // -1: the planner's choice; 0 / 1 force it
  int exp2_poly_every = -1; // -1: the planner's choice; 0: MUFU only; k: every k-th column group on FMA
};

bool plan_fa3_tuned(const KernelSpec &spec, const Fa3Tuning &tuning, Plan *plan, std::string *why_not);

} // namespace flashjit
