#include "compiler/planner.hpp"
#include "compiler/plans/fa3_plan.hpp"

namespace flashjit {
namespace {

PlanChoice planned(const KernelSpec &spec, const Plan &plan, Variant preferred, std::string reason) {
  PlanChoice choice;
  choice.spec = spec;
  choice.plan = plan;
  choice.preferred = preferred;
  choice.fallback_reason = std::move(reason);
  choice.ok = true;
  return choice;
}

PlanChoice failed(const KernelSpec &spec, std::string error) {
  PlanChoice choice;
  choice.spec = spec;
  choice.error = std::move(error);
  return choice;
}

bool plan_fa3_with(const KernelSpec &spec, const Fa3Tuning *tuning, Plan *plan, std::string *why_not,
                   flashjit_backend backend) {
  return tuning ? plan_fa3_tuned(spec, *tuning, plan, why_not, backend) : plan_fa3(spec, plan, why_not, backend);
}

PlanChoice choose_prefill(const KernelSpec &spec, flashjit_backend backend, const Fa3Tuning *fa3_tuning) {
  Plan plan;
  std::string fa3_reason;
  if (spec.arch.sm == 90 && spec.arch.arch_specific) {
    if (std::string fa2_first = fa2_preferred_for_pages(spec, fa3_tuning); !fa2_first.empty()) {
      if (plan_fa2(spec, &plan, nullptr, backend)) {
        PlanChoice choice = planned(spec, plan, Variant::fa2, "");
        choice.preference_reason = std::move(fa2_first);
        return choice;
      }
    }
    if (plan_fa3_with(spec, fa3_tuning, &plan, &fa3_reason, backend))
      return planned(spec, plan, Variant::fa3, "");
  }
  std::string fa2_reason;
  if (plan_fa2(spec, &plan, &fa2_reason, backend)) {
    bool fa3_preferred = !fa3_reason.empty();
    return planned(spec, plan, fa3_preferred ? Variant::fa3 : Variant::fa2,
                   fa3_preferred ? "fa3 cannot run this spec: " + fa3_reason : "");
  }
  return failed(spec, "no prefill kernel for this spec: fa2: " + fa2_reason +
                          (fa3_reason.empty() ? "" : "; fa3: " + fa3_reason));
}

PlanChoice choose_decode(const KernelSpec &spec, flashjit_backend backend, const Fa3Tuning *fa3_tuning) {
  Plan plan;
  std::string decode_reason;
  if (plan_decode(spec, &plan, &decode_reason, backend))
    return planned(spec, plan, Variant::decode_splitk, "");
  // The prefill kernel computes the same function for short query lengths, only slower.
  KernelSpec prefill = spec;
  prefill.op = Op::prefill;
  prefill.gqa_group = 0;
  prefill.q_len = 0;
  PlanChoice fallback = choose_prefill(prefill, backend, fa3_tuning);
  if (!fallback.ok)
    return failed(spec, "no decode kernel: " + decode_reason + "; " + fallback.error);
  fallback.preferred = Variant::decode_splitk;
  fallback.preference_reason.clear(); // the prefill's choice among its variants, not the decode's
  fallback.fallback_reason = "decode_splitk cannot run this spec: " + decode_reason;
  return fallback;
}

PlanChoice choose_forced(const KernelSpec &spec, Variant forced, flashjit_backend backend,
                         const Fa3Tuning *fa3_tuning) {
  Plan plan;
  std::string reason;
  bool ok = false;
  KernelSpec effective = spec;
  switch (forced) {
  case Variant::fa2:
  case Variant::fa3:
    effective.op = Op::prefill;
    effective.gqa_group = 0;
    effective.q_len = 0;
    ok = forced == Variant::fa2 ? plan_fa2(effective, &plan, &reason, backend)
                                : plan_fa3_with(effective, fa3_tuning, &plan, &reason, backend);
    break;
  case Variant::decode_splitk: ok = spec.op == Op::decode && plan_decode(spec, &plan, &reason, backend); break;
  case Variant::combine: ok = plan_combine(spec, &plan, &reason); break;
  }
  if (!ok)
    return failed(spec, std::string("the requested variant ") + variant_name(forced) + " cannot run this spec" +
                            (reason.empty() ? " (decode kernels need a decode-shaped problem)" : ": " + reason));
  return planned(effective, plan, forced, "");
}

} // namespace

PlanChoice choose_plan(const KernelSpec &spec, std::optional<Variant> forced, flashjit_backend backend,
                       const Fa3Tuning *fa3_tuning) {
  if (forced)
    return choose_forced(spec, *forced, backend, fa3_tuning);
  switch (spec.op) {
  case Op::prefill: return choose_prefill(spec, backend, fa3_tuning);
  case Op::decode: return choose_decode(spec, backend, fa3_tuning);
  case Op::combine: {
    Plan plan;
    std::string reason;
    if (plan_combine(spec, &plan, &reason))
      return planned(spec, plan, Variant::combine, "");
    return failed(spec, "no combine kernel: " + reason);
  }
  }
  return failed(spec, "unknown op");
}

} // namespace flashjit
