// Tuning knobs of the decode planner (compiler/plans/decode_plan.cpp), for A/B measurements and
// tests; plan_decode() (compiler/planner.hpp) uses the defaults.
#pragma once

#include "compiler/plan.hpp"

#include <string>
#include <string_view>

namespace flashjit {

struct DecodeTuning {
  // Plan constant kFusedMerge. -1: the planner's choice (1); 0: the split units are merged by
  // fj_decode_combine in a second launch; 1: inside fj_decode_splitk, one launch per step.
  int fused_merge = -1;
  // Warps per CTA (each owns warp_keys keys of a tile, so block_n = warps * warp_keys). 0: the
  // planner's choice (4, else 2 where shared memory is small).
  int warps = 0;
  // Keys per warp per tile (a multiple of 16: whole P.V k steps). 0: the planner's 16.
  int warp_keys = 0;
  // Plan constant kTmaKv. -1: the planner's choice (TMA tiles wherever the spec allows them); 0:
  // cp.async tiles; 1: TMA tiles, or no plan (with the reason) where the spec does not allow them.
  int tma_kv = -1;
};

// Why the decode kernel's K/V tiles cannot land by TMA for this spec and tile of `block_n` keys
// (empty when they can): what `explain` says of a plan with kTmaKv 0. A view of a literal: the
// runtime asks on every decode call (decode_key_block_for), so the answer allocates nothing.
std::string_view tma_kv_unsupported(const KernelSpec &spec, flashjit_backend backend, int block_n);

bool plan_decode_tuned(const KernelSpec &spec, const DecodeTuning &tuning, Plan *plan, std::string *why_not,
                       flashjit_backend backend = FLASHJIT_BACKEND_AUTO);

} // namespace flashjit
