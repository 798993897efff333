// Plan: the single source of truth for how a spec is realized (variant, tiles, smem layout,
// barrier ids, register split). Templates and generators render it; they never re-derive it.
#pragma once

#include "compiler/spec.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashjit {

// A compile-time constant handed to the template as `KernelConfig::<name>`.
struct PlanConstant {
  std::string name;
  int64_t value;
  bool is_bool = false;
  bool operator==(const PlanConstant &) const = default;
};

struct Plan {
  Variant variant = Variant::fa2;
  std::string entry; // kernel symbol in the module
  int block_m = 0;
  int block_n = 0;
  int stages = 0;
  int threads = 0;
  int smem_bytes = 0;          // dynamic shared memory per CTA
  int consumer_warpgroups = 0; // fa3
  bool pingpong = false;       // fa3
  bool persistent = false;     // grid sized to the SM count
  int cluster_m = 1;           // fa3: CTAs per thread-block cluster (pairs share K/V by multicast)
  // Every variant-specific constant (smem offsets, swizzle, barrier ids, register split...).
  std::vector<PlanConstant> constants;

  void add(std::string name, int64_t value) { constants.push_back({std::move(name), value, false}); }
  void add_bool(std::string name, bool value) { constants.push_back({std::move(name), value ? 1 : 0, true}); }
  // A string_view: launches look constants up per call, and a literal made into a std::string
  // past the small-string size allocates.
  int64_t constant(std::string_view name, int64_t fallback = -1) const;
  bool operator==(const Plan &) const = default;
};

// Canonical, human-readable name of a specialization, e.g.
//   prefill.fa2.sm90a.d80v80.bf16.causal.m128n64s2.al16
std::string kernel_name(const KernelSpec &spec, const Plan &plan);
// Stable 64-bit hash (xxh64) of the canonical name plus every plan constant.
uint64_t kernel_hash(const KernelSpec &spec, const Plan &plan);

} // namespace flashjit
