// TMA descriptors and persistent schedule of the fa3 kernel, and the decode kernel's K/V maps,
// computed on the host.
//
// fa3_tensor_map_args() is pure (no driver, no GPU): it turns an attention problem and its plan
// into the arguments of the four cuTensorMapEncodeTiled calls (Q, K, V, O). The runtime encodes
// them through the driver's function pointer (fa3_encode_tensor_maps), so tests can check every
// dim, stride and box without a device.
#pragma once

#include "compiler/plan.hpp"
#include "params_decode.h"
#include "params_fa3.h"

#include <cuda.h> // types only: CUtensorMap and its enums; the driver is reached through `encode`

#include <string>

namespace flashjit {

constexpr int kTensorMapMaxRank = 5;

// The arguments of one cuTensorMapEncodeTiled call (strides in bytes, innermost dim first).
struct TensorMapArgs {
  CUtensorMapDataType data_type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  cuuint32_t rank = 0;
  void *global_address = nullptr;
  cuuint64_t dims[kTensorMapMaxRank] = {};
  cuuint64_t strides[kTensorMapMaxRank - 1] = {}; // stride of dims[1..rank-1]
  cuuint32_t box[kTensorMapMaxRank] = {};
  cuuint32_t element_strides[kTensorMapMaxRank] = {};
  CUtensorMapInterleave interleave = CU_TENSOR_MAP_INTERLEAVE_NONE;
  CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_NONE;
  CUtensorMapL2promotion l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_NONE;
  CUtensorMapFloatOOBfill oob_fill = CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE; // NONE = zeros
};

struct Fa3TensorMaps {
  TensorMapArgs q, k, v, o;
  bool has_kv = true; // false: a paged gather (kPagedGather) reads K/V by cp.async, through no map
};

// cuTensorMapEncodeTiled's signature (the runtime passes the driver's entry point).
using TensorMapEncodeTiledFn = CUresult (*)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                            const cuuint64_t *, const cuuint32_t *, const cuuint32_t *,
                                            CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                            CUtensorMapFloatOOBfill);

// Maps are 4-D {dim, tokens, heads, batch}; varlen: {dim, total rows, heads, 1} over the packed
// tensor (`total_k` = rows of packed K/V, which fj_attention_params does not carry); paged K/V:
// {dim, page_size, heads_kv, num_pages}. Boxes are one 64-column panel (128 B, the swizzle span) x
// kBlockN rows (K, V; a pair's share with CTA pairs, kPagedBoxRows when paged) or kTmaBoxRows (Q, O).
// A paged gather (kPagedGather) has no K/V maps (has_kv false). False, with a reason, when TMA
// cannot address the layout (unaligned pointer or stride).
bool fa3_tensor_map_args(const KernelSpec &spec, const Plan &plan, const fj_attention_params &params, int total_k,
                         int num_pages, Fa3TensorMaps *maps, std::string *why_not);

// Encodes the maps into params->tma_{q,k,v,o} (k and v left as they are without has_kv).
bool fa3_encode_tensor_maps(const KernelSpec &spec, const Plan &plan, int total_k, int num_pages,
                            TensorMapEncodeTiledFn encode, fj_fa3_params *params, std::string *why_not);

// decode_splitk with TMA tiles (plan constant kTmaKv): K's and V's maps, 4-D {dim, heads_kv, keys,
// batch} over contiguous KV or {dim, heads_kv, page_size, num_pages} over pages, boxes of one
// 64-column panel x kTmaBoxRows keys, 128-byte swizzle (kernels/decode/traits.cuh's TmaTile). Pure, as
// fa3_tensor_map_args; false, with a reason, when TMA cannot address the layout.
struct DecodeKvTensorMaps {
  TensorMapArgs k, v;
};
bool decode_kv_tensor_map_args(const KernelSpec &spec, const Plan &plan, const fj_attention_params &params,
                               int num_pages, DecodeKvTensorMaps *maps, std::string *why_not);

// Encodes both into params->k_map / v_map (params->base.attn must be filled).
bool decode_encode_tensor_maps(const KernelSpec &spec, const Plan &plan, int num_pages, TensorMapEncodeTiledFn encode,
                               fj_decode_tma_params *params, std::string *why_not);

// Fills num_m_blocks, num_tiles (work units: plan.cluster_m adjacent m-blocks each) and
// heads_per_section; returns the persistent grid size in CTAs: plan.cluster_m * min(walkers, units),
// at least one cluster, where walkers = SM count / plan.cluster_m, or `resident_clusters` when that is
// positive and smaller (clusters the device can hold at once; a grid beyond it would run a second,
// serial wave). `l2_bytes` is the device's L2 size. `tiles_drawn` false: a plan that draws its tiles
// (kDynamicTiles) launched without the workspace for its counter, which walks the snake's order and so
// takes the snake's causal sections.
int fa3_fill_schedule(const KernelSpec &spec, const Plan &plan, int num_sms, int l2_bytes, fj_fa3_params *params,
                      int resident_clusters = 0, bool tiles_drawn = true);

// A model of a causal walk's load balance over `walkers` walkers (templates/kernels/fa3/scheduler.cuh:
// the snake over sections of params->heads_per_section pairs, heaviest m-blocks first), each tile
// costing its visible key blocks plus one for its prologue and epilogue: the mean walker load over the
// largest (1: even). Causal walks run single CTAs, so a work unit is one m-block. fa3_fill_schedule
// takes the L2 section it prefers where no even whole-wave section fits (kCausalSections 0) or always
// (kCausalSections 3).
double fa3_causal_walk_balance(const Plan &plan, const fj_fa3_params &params, int walkers);

// Tail split (plan constant kTailSplit): fills params->tail_* for `walkers` walkers from num_tiles
// and seqlen_k (all zero when the plan has no split or nothing would even out). Called by
// fa3_fill_schedule; the workspace pointers are the launch's.
void fa3_fill_tail(const Plan &plan, int walkers, fj_fa3_params *params);

// Where the tail split's counters and partial states, or the dynamic tiles' counter, lie in the
// caller's workspace, for `walkers` walkers (total_bytes 0: the plan needs no workspace).
struct Fa3WorkspaceLayout {
  size_t counter_bytes = 0;   // at offset 0; zero when a launch starts, and left so by it
  size_t partials_offset = 0; // 256-byte aligned
  size_t total_bytes = 0;
};
Fa3WorkspaceLayout fa3_workspace_layout(const Plan &plan, int walkers);

} // namespace flashjit
