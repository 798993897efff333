#include "compiler/plan.hpp"

#include <xxhash.h>

#include <string>

namespace flashjit {

namespace {
constexpr int64_t kDefaultFa2RowsPerWarp = 16; // one m16 MMA row block per warp
} // namespace

int64_t Plan::constant(std::string_view name, int64_t fallback) const {
  for (const PlanConstant &c : constants)
    if (c.name == name)
      return c.value;
  return fallback;
}

std::string kernel_name(const KernelSpec &spec, const Plan &plan) {
  std::string name = std::string(op_name(spec.op)) + "." + variant_name(plan.variant) + "." + spec.arch.name();
  if (spec.op != Op::combine) {
    name += ".d" + std::to_string(spec.head_dim_qk) + "v" + std::to_string(spec.head_dim_v);
  } else {
    name += ".v" + std::to_string(spec.head_dim_v);
  }
  name += std::string(".") + dtype_name(spec.dtype);
  if (spec.op != Op::combine) {
    name += spec.causal ? ".causal" : ".full";
    if (spec.local)
      name += ".window";
    if (spec.softcap)
      name += ".softcap";
    if (spec.varlen)
      name += ".varlen";
    if (spec.page_size > 0)
      name += ".page" + std::to_string(spec.page_size);
    if (spec.gqa_group > 0)
      name += ".g" + std::to_string(spec.gqa_group);
    if (spec.q_len > 0)
      name += ".q" + std::to_string(spec.q_len);
  }
  if (plan.block_m > 0)
    name +=
        ".m" + std::to_string(plan.block_m) + "n" + std::to_string(plan.block_n) + "s" + std::to_string(plan.stages);
  // fa2 running a key block in several QK -> softmax -> PV steps: "k" and the keys per step.
  if (const int64_t sub_block_n = plan.constant("kSubBlockN", plan.block_n);
      plan.variant == Variant::fa2 && sub_block_n != plan.block_n)
    name += "k" + std::to_string(sub_block_n);
  // fa2 with a non-default warp shape (Fa2Tuning::rows_per_warp) must not share a name with the default.
  if (const int64_t rows_per_warp = plan.constant("kRowsPerWarp", kDefaultFa2RowsPerWarp);
      plan.variant == Variant::fa2 && rows_per_warp != kDefaultFa2RowsPerWarp)
    name += ".r" + std::to_string(rows_per_warp);
  if (plan.consumer_warpgroups > 0)
    name += ".wg" + std::to_string(plan.consumer_warpgroups) + (plan.pingpong ? "pp" : "");
  if (plan.cluster_m > 1)
    name += ".cl" + std::to_string(plan.cluster_m);
  // fa3 with the lazy O rescale: another kernel than the eager one of the same tile (MLIR builds that).
  if (plan.constant("kLazyRescale", 0) != 0)
    name += plan.constant("kLazyTopRounding", 0) != 0 ? ".lzt" : ".lz"; // "t": O normalized by the rounded top p
  // fa3 overlapping a tile's last PV and epilogue with the next tile's first QK (NVRTC builds only).
  if (plan.constant("kCrossTileOverlap", 0) != 0)
    name += ".xt";
  // fa3 splitting the last waves' tiles by keys (NVRTC builds only).
  if (plan.constant("kTailSplit", 0) != 0)
    name += ".ts";
  // fa3 whose tiles are drawn from a counter as CTAs finish (NVRTC builds only).
  if (plan.constant("kDynamicTiles", 0) != 0)
    name += ".dt";
  // fa3 with a tile's first key block in the key loop (NVRTC builds only).
  if (plan.constant("kFirstBlockInLoop", 0) != 0)
    name += ".fl";
  // fa3 whose key loop carries no mask code (both backends).
  if (plan.constant("kUnmaskedKeyLoop", 0) != 0)
    name += ".um";
  // fa3 launched as a programmatic dependent of the previous grid (NVRTC builds only).
  if (plan.constant("kProgrammaticLaunch", 0) != 0)
    name += ".pdl";
  // fa3 rebuilding Q's descriptors per k-step (two consumer warpgroups by default).
  if (plan.constant("kQDescPerStep", 0) != 0)
    name += ".qs";
  // fa3 with Q's A fragments in registers (RS QK; NVRTC builds only).
  if (plan.constant("kQInRegisters", 0) != 0)
    name += ".qr";
  // fa3 advancing each GEMM's wgmma descriptors from its first (NVRTC builds only).
  if (plan.constant("kDescAdvance", 0) != 0)
    name += ".da";
  // fa3 whose pingpong turn covers the softmax rather than the GEMM issue (NVRTC builds only).
  if (plan.constant("kPingpongSoftmax", 0) != 0)
    name += ".pps";
  // fa3 building a QK's first wgmma descriptors before the K wait (NVRTC builds only).
  if (plan.constant("kEarlyQkDesc", 0) != 0)
    name += ".eqd";
  // fa3 whose pingpong turn holds the QK issue only (NVRTC builds only).
  if (plan.constant("kTurnOverQk", 0) != 0)
    name += ".tq";
  // fa3 awaiting a step's S before issuing its PV (NVRTC builds only).
  if (plan.constant("kSBeforePv", 0) != 0)
    name += ".sbp";
  // fa3 whose key-loop exponentials do not wait for the block's max (NVRTC builds only).
  if (plan.constant("kExpBeforeMax", 0) != 0)
    name += ".ebm";
  // fa3 recording one CTA's timeline (a diagnostic; NVRTC builds only).
  if (plan.constant("kTimeline", 0) != 0)
    name += ".tl";
  // fa3 skipping the exponentials of the prologue block's fully masked column chunks (.skm) or half
  // (.skh) (NVRTC builds only).
  if (const int64_t skip = plan.constant("kSkipMaskedGroups", 0); skip != 0)
    name += skip == 1 ? ".skm" : ".skh";
  // fa3 summing each row in several interleaved partial sums (NVRTC builds only).
  if (const int64_t sums = plan.constant("kRowSumPartials", 1); sums > 1)
    name += ".rs" + std::to_string(sums);
  // fa3 compiled at a lower ptxas optimization level (NVRTC builds only).
  if (const int64_t level = plan.constant("kPtxasOptLevel", 0); level > 0)
    name += ".o" + std::to_string(level);
  // fa3 computing the exponent as (s - max) * c (NVRTC builds only).
  if (plan.constant("kExpSubtractFirst", 0) != 0)
    name += ".es";
  // fa3 causal walk order other than the default (kCausalSections): the launch's rule, not the
  // kernel's code, but kernels that walk differently must not share a name.
  if (const int64_t sections = plan.constant("kCausalSections", 0); sections != 0)
    name += ".cs" + std::to_string(sections);
  if (const int64_t pairs = plan.constant("kCausalSectionPairs", 0); pairs != 0)
    name += ".sp" + std::to_string(pairs);
  if (const int64_t pairs = plan.constant("kSectionPairs", 0); pairs != 0) // unmasked walk (Fa3Tuning::section_pairs)
    name += ".usp" + std::to_string(pairs);
  // fa3 paged KV gathered by cp.async rather than loaded in TMA boxes.
  if (plan.constant("kPagedGather", 0) != 0)
    name += ".gather";
  // fa3 gather whose copies arrive on the full barrier as they land (NVRTC builds only).
  if (plan.constant("kGatherNoincArrive", 0) != 0)
    name += ".noinc";
  // decode with K/V tiles by TMA (NVRTC builds only).
  if (plan.constant("kTmaKv", 0) != 0)
    name += ".tma";
  name += ".al" + std::to_string(spec.align_bytes);
  return name;
}

uint64_t kernel_hash(const KernelSpec &spec, const Plan &plan) {
  // The name covers the spec and the main tiles; the constants cover the rest of the plan.
  std::string record = kernel_name(spec, plan) + "|" + plan.entry + "|t" + std::to_string(plan.threads) + "|s" +
                       std::to_string(plan.smem_bytes) + (plan.persistent ? "|persistent" : "");
  for (const PlanConstant &c : plan.constants)
    record += "|" + c.name + "=" + std::to_string(c.value);
  return XXH64(record.data(), record.size(), 0);
}

} // namespace flashjit
