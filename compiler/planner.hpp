// Planner: picks the variant and its tiles for a spec. Each variant's planner lives in
// compiler/plans/<variant>_plan.cpp and answers either a Plan or why it cannot run the spec.
#pragma once

#include "compiler/plan.hpp"

#include <flashjit/flashjit.h>

#include <cstdint>
#include <optional>
#include <string>

namespace flashjit {

struct Fa3Tuning; // compiler/plans/fa3_plan.hpp

// `backend` is the one that will render the plan (AUTO renders with NVRTC): fa2's widest key blocks
// fit 255 registers in one backend's build and not in the other's (compiler/plans/fa2_plan.cpp);
// fa3's CTA-pair (cluster) kernel has a template form only (compiler/plans/fa3_plan.cpp), and so
// do decode's TMA tiles (compiler/plans/decode_plan.cpp).
bool plan_fa2(const KernelSpec &spec, Plan *plan, std::string *why_not,
              flashjit_backend backend = FLASHJIT_BACKEND_AUTO);
bool plan_fa3(const KernelSpec &spec, Plan *plan, std::string *why_not,
              flashjit_backend backend = FLASHJIT_BACKEND_AUTO);
bool plan_decode(const KernelSpec &spec, Plan *plan, std::string *why_not,
                 flashjit_backend backend = FLASHJIT_BACKEND_AUTO);
bool plan_combine(const KernelSpec &spec, Plan *plan, std::string *why_not);

// fa3 prefill: the short-sequence tile's key block (KernelSpec::key_block) where it runs a problem of
// `seqlen_q` queries and `seqlen_k` keys per sequence faster than the planner's default tile, or 0 for
// the default. Unmasked: a shorter key block where the default pads the keys less (128 for longer
// defaults, 96 for the 112-key pair tiles), or the default block without the tail split where no unit
// is long enough to split. Causal up to 1024 tokens: two consumer warpgroups where the default has
// three, 96-key blocks for the 112-key tiles. Only fixed-length specs on sm_90a have one
// (fa3_short_key_block); it is cheap enough for the per-call path. The backend matters: the MLIR
// plans of some specs take other tiles (no CTA pairs, no causal short tile).
int fa3_key_block_for(const KernelSpec &spec, int seqlen_q, int seqlen_k,
                      flashjit_backend backend = FLASHJIT_BACKEND_AUTO);
// The one alternative key block of a spec (0: none), which `flashjit aot` builds beside the default.
int fa3_short_key_block(const KernelSpec &spec, flashjit_backend backend = FLASHJIT_BACKEND_AUTO);
// decode: the key block (KernelSpec::key_block) for a problem of `key_heads` keys x KV heads in
// all (batch x KV length, or the block table's capacity when paged, x heads_kv), or 0 for the
// planner's tiles. Only short steps of TMA-eligible specs up to d128 take the wide block; the MLIR
// backend renders no TMA tiles, so it never does.
int decode_key_block_for(const KernelSpec &spec, int64_t key_heads, flashjit_backend backend = FLASHJIT_BACKEND_AUTO);
// The wide key block of a decode spec (0: none), which `flashjit aot` builds beside the default.
int decode_wide_key_block(const KernelSpec &spec, flashjit_backend backend = FLASHJIT_BACKEND_AUTO);

struct PlanChoice {
  KernelSpec spec; // the spec the plan realizes (a fallback may change the op)
  Plan plan;
  Variant preferred = Variant::fa2; // what the planner wanted for this spec
  std::string fallback_reason;      // why `plan.variant` is not `preferred` (empty if it is)
  std::string preference_reason;    // why `preferred` is not the op's first choice on this arch (empty if it is)
  bool ok = false;
  std::string error; // when !ok: no variant can run the spec
};

// Preferred variant per op and arch: prefill -> fa3 on sm90a (but fa2 where it was measured faster:
// fa2_preferred_for_pages), else fa2; decode -> decode_splitk.
// When the preferred variant's planner declines, the next one is tried and the reason recorded.
// `forced` (if set) must run the spec, else the choice fails with that variant's reason. `backend`
// renders the plan (see plan_fa2).
// `fa3_tuning` (if set) replaces the fa3 planner's defaults (FLASHJIT_FA3_TUNING); a tuning the spec
// cannot take makes fa3 decline like any other reason.
PlanChoice choose_plan(const KernelSpec &spec, std::optional<Variant> forced = std::nullopt,
                       flashjit_backend backend = FLASHJIT_BACKEND_AUTO, const Fa3Tuning *fa3_tuning = nullptr);

} // namespace flashjit
