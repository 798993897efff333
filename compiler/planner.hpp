// Planner: picks the variant and its tiles for a spec. Each variant's planner lives in
// compiler/plans/<variant>_plan.cpp and answers either a Plan or why it cannot run the spec.
#pragma once

#include "compiler/plan.hpp"

#include <optional>
#include <string>

namespace flashjit {

bool plan_fa2(const KernelSpec &spec, Plan *plan, std::string *why_not);
bool plan_fa3(const KernelSpec &spec, Plan *plan, std::string *why_not);
bool plan_decode(const KernelSpec &spec, Plan *plan, std::string *why_not);
bool plan_combine(const KernelSpec &spec, Plan *plan, std::string *why_not);

struct PlanChoice {
  KernelSpec spec; // the spec the plan realizes (a fallback may change the op)
  Plan plan;
  Variant preferred = Variant::fa2; // what the planner wanted for this spec
  std::string fallback_reason;      // why `plan.variant` is not `preferred` (empty if it is)
  bool ok = false;
  std::string error; // when !ok: no variant can run the spec
};

// Preferred variant per op and arch: prefill -> fa3 on sm90a, else fa2; decode -> decode_splitk.
// When the preferred variant's planner declines, the next one is tried and the reason recorded.
// `forced` (if set) must run the spec, else the choice fails with that variant's reason.
PlanChoice choose_plan(const KernelSpec &spec, std::optional<Variant> forced = std::nullopt);

} // namespace flashjit
