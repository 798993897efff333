// Merge of partial attention states. Each state i is a row O_i (normalized over its own keys, fp32)
// with its natural-log LSE_i; the merged row is
//   LSE = log(sum_i exp(LSE_i)),   O = sum_i exp(LSE_i - LSE) * O_i.
// A state with LSE_i = -inf saw no key and weighs 0; when every state is -inf the row saw no key
// at all: O = 0, LSE = -inf. The same row merge serves the split-K decode (its partial states) and
// `fj_combine`, the standalone merge engines use for ring / context-parallel attention.
//
// Requires from KernelConfig: kDType, kHeadDimV, kAligned16, kCombineThreads.
#pragma once

#include "kernel_params.h"
#include "prim/ld_global.cuh"
#include "prim/math.cuh"
#include "prim/st_global.cuh"
#include "prim/types.cuh"
#include "prim/warp.cuh"

namespace fj {

// One warp merges one row. Every lane owns groups of kF32PerVec consecutive columns (one float4
// load per state); states go kBatch at a time, all of a batch's loads issued before any is
// used, so a merge of n states costs about n / kBatch memory latencies, not n.
constexpr int kF32PerVec = 4;
constexpr int kMergeLoadsInFlight = 8; // float4 loads per lane per batch
// finish_piece (decode) writes eight columns per thread: one 16-byte store of 16-bit values.
constexpr int kMergeChunk = 8;

template <int HeadDimV> struct MergeShape {
  static_assert(HeadDimV % kMergeChunk == 0, "head_dim_v must be a multiple of 8");
  static constexpr int kVecs = HeadDimV / kF32PerVec;
  static constexpr int kVecsPerLane = (kVecs + kWarpSize - 1) / kWarpSize;
  static constexpr int kBatch = kMergeLoadsInFlight / kVecsPerLane; // states per batch
};

// Loads of partial states. `Coherent`: other CTAs of the running grid wrote them (the decode's
// fused merge), so they go through L2 (ld.global.cg); else the read-only path (ld.global.nc).
// Only the load instruction differs: the merge's arithmetic is the same either way.
template <bool Coherent> __device__ __forceinline__ float ld_state_f32(const float *address) {
  if constexpr (Coherent)
    return ld_global_cg_f32(address);
  else
    return ld_global_nc_f32(address);
}
template <bool Coherent> __device__ __forceinline__ void ld_state_v4_f32(float (&out)[4], const float *address) {
  if constexpr (Coherent)
    ld_global_cg_v4_f32(out, address);
  else
    ld_global_nc_v4_f32(out, address);
}

// Largest LSE over `count` states (lanes stride over the states, then a warp reduction).
template <bool Coherent> __device__ __forceinline__ float states_max_lse(const float *lse, i64 stride, int count) {
  float best = neg_inf();
  for (int s = lane_id(); s < count; s += kWarpSize)
    best = max_f32(best, ld_state_f32<Coherent>(lse + s * stride));
  return warp_reduce_max(best);
}

// sum_i 2^((LSE_i - max) * log2 e); the caller skips it when max = -inf.
template <bool Coherent>
__device__ __forceinline__ float states_sum_exp(const float *lse, i64 stride, int count, float max_lse) {
  float sum = 0.f;
  for (int s = lane_id(); s < count; s += kWarpSize)
    sum += ex2_approx((ld_state_f32<Coherent>(lse + s * stride) - max_lse) * kLog2e);
  return warp_reduce_sum(sum);
}

// Writes N fp32 values as 16-bit elements: one vector store when the row is 16-byte aligned.
template <int DType, bool Aligned16, int N>
__device__ __forceinline__ void store_16bit(void *out, const float (&v)[N]) {
  static_assert(N == 4 || N == 8, "8- or 16-byte stores");
  if constexpr (Aligned16) {
    u32 packed[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i)
      packed[i] = pack2_from_f32<DType>(v[2 * i], v[2 * i + 1]);
    if constexpr (N == 8)
      st_global_v4_b32(out, packed);
    else
      st_global_v2_b32(out, packed);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i)
      st_global_b16(static_cast<u16 *>(out) + i, from_f32<DType>(v[i]));
  }
}

// One batch of states (kBatch from `first`): their LSEs, then their O rows. Loads are unconditional
// (indices clamped to the last state / column, their weight or store dropped) so that a batch
// issues as one burst without branches.
template <class Shape, bool Coherent>
__device__ __forceinline__ void
load_state_batch(float (&lse)[Shape::kBatch], float (&v)[Shape::kBatch][Shape::kVecsPerLane][kF32PerVec],
                 const float *o_states, i64 o_stride, const float *lse_states, i64 lse_stride, int first, int count) {
#pragma unroll
  for (int b = 0; b < Shape::kBatch; ++b)
    lse[b] = ld_state_f32<Coherent>(lse_states + min(first + b, count - 1) * lse_stride);
#pragma unroll
  for (int b = 0; b < Shape::kBatch; ++b)
#pragma unroll
    for (int c = 0; c < Shape::kVecsPerLane; ++c) {
      const int vec = min(lane_id() + c * kWarpSize, Shape::kVecs - 1);
      ld_state_v4_f32<Coherent>(v[b][c], o_states + min(first + b, count - 1) * o_stride + vec * kF32PerVec);
    }
}

// acc += weight * state (an empty state weighs 0 and its O may be anything).
template <class Shape>
__device__ __forceinline__ void accumulate_state(float (&acc)[Shape::kVecsPerLane][kF32PerVec], float weight,
                                                 const float (&v)[Shape::kVecsPerLane][kF32PerVec]) {
#pragma unroll
  for (int c = 0; c < Shape::kVecsPerLane; ++c)
#pragma unroll
    for (int i = 0; i < kF32PerVec; ++i)
      acc[c][i] += weight > 0.f ? weight * v[c][i] : 0.f;
}

// The lane's columns of the merged row, as 16-bit values.
template <int DType, bool Aligned16, class Shape>
__device__ __forceinline__ void store_merged_row(float (&acc)[Shape::kVecsPerLane][kF32PerVec], void *out_row) {
#pragma unroll
  for (int c = 0; c < Shape::kVecsPerLane; ++c) {
    const int vec = lane_id() + c * kWarpSize;
    if (vec < Shape::kVecs)
      store_16bit<DType, Aligned16>(static_cast<u16 *>(out_row) + vec * kF32PerVec, acc[c]);
  }
}

// Merges `count` states of one row (warp-wide). `o_states` points at state 0's row (16-byte
// aligned, fp32), `o_stride` / `lse_stride` step between states; `out_row` receives 16-bit values.
// `Coherent`: see ld_state_f32.
template <int DType, int HeadDimV, bool Aligned16, bool Coherent = false>
__device__ __forceinline__ void merge_states_row(const float *o_states, i64 o_stride, const float *lse_states,
                                                 i64 lse_stride, int count, void *out_row, float *maybe_out_lse) {
  using Shape = MergeShape<HeadDimV>;
  const float max_lse = states_max_lse<Coherent>(lse_states, lse_stride, count);
  const bool empty = max_lse == neg_inf();
  const float sum = empty ? 0.f : states_sum_exp<Coherent>(lse_states, lse_stride, count, max_lse);
  const float inv_sum = empty ? 0.f : rcp_approx(sum);

  float acc[Shape::kVecsPerLane][kF32PerVec] = {};
  for (int first = 0; !empty && first < count; first += Shape::kBatch) {
    float lse[Shape::kBatch];
    float v[Shape::kBatch][Shape::kVecsPerLane][kF32PerVec];
    load_state_batch<Shape, Coherent>(lse, v, o_states, o_stride, lse_states, lse_stride, first, count);
#pragma unroll
    for (int b = 0; b < Shape::kBatch; ++b)
      accumulate_state<Shape>(acc, first + b < count ? ex2_approx((lse[b] - max_lse) * kLog2e) * inv_sum : 0.f, v[b]);
  }
  store_merged_row<DType, Aligned16, Shape>(acc, out_row);
  if (maybe_out_lse != nullptr && lane_id() == 0)
    st_global_f32(maybe_out_lse, empty ? neg_inf() : max_lse + lg2_approx(sum) * kLn2);
}

// acc *= factor.
template <class Shape>
__device__ __forceinline__ void scale_accumulator(float (&acc)[Shape::kVecsPerLane][kF32PerVec], float factor) {
#pragma unroll
  for (int c = 0; c < Shape::kVecsPerLane; ++c)
#pragma unroll
    for (int i = 0; i < kF32PerVec; ++i)
      acc[c][i] *= factor;
}

// Diagnostic variant (bench/harness/decode, FJ_DECODE_MERGE_ONE_PASS; not in any plan): the same
// merge in one pass over the states. Each batch loads its LSEs and O rows together, the running
// max moves by the batch's largest LSE and rescales the sum and the accumulator, so a merge of n
// states waits for n / kBatch loads instead of two more for the LSE max and sum passes. Rounds
// differently from merge_states_row (the weights are relative to a moving max).
template <int DType, int HeadDimV, bool Aligned16, bool Coherent = false>
__device__ __forceinline__ void merge_states_row_one_pass(const float *o_states, i64 o_stride, const float *lse_states,
                                                          i64 lse_stride, int count, void *out_row,
                                                          float *maybe_out_lse) {
  using Shape = MergeShape<HeadDimV>;
  float run_max = neg_inf(), run_sum = 0.f;
  float acc[Shape::kVecsPerLane][kF32PerVec] = {};
  for (int first = 0; first < count; first += Shape::kBatch) {
    float lse[Shape::kBatch];
    float v[Shape::kBatch][Shape::kVecsPerLane][kF32PerVec];
    load_state_batch<Shape, Coherent>(lse, v, o_states, o_stride, lse_states, lse_stride, first, count);
    float batch_max = run_max;
#pragma unroll
    for (int b = 0; b < Shape::kBatch; ++b)
      batch_max = first + b < count ? max_f32(batch_max, lse[b]) : batch_max;
    if (batch_max == neg_inf())
      continue; // no state so far saw a key
    const float old_scale = run_max == batch_max ? 1.f : ex2_approx((run_max - batch_max) * kLog2e);
    run_sum *= old_scale;
    scale_accumulator<Shape>(acc, old_scale);
#pragma unroll
    for (int b = 0; b < Shape::kBatch; ++b) {
      const float weight = first + b < count ? ex2_approx((lse[b] - batch_max) * kLog2e) : 0.f;
      run_sum += weight;
      accumulate_state<Shape>(acc, weight, v[b]);
    }
    run_max = batch_max;
  }
  const bool empty = run_max == neg_inf();
  const float inv_sum = empty ? 0.f : rcp_approx(run_sum);
  scale_accumulator<Shape>(acc, inv_sum);
  store_merged_row<DType, Aligned16, Shape>(acc, out_row);
  if (maybe_out_lse != nullptr && lane_id() == 0)
    st_global_f32(maybe_out_lse, empty ? neg_inf() : run_max + lg2_approx(run_sum) * kLn2);
}

} // namespace fj

// Standalone merge: rows x num_states states, one warp per row, grid-stride over the rows.
// Min blocks 1 in the bounds: without it ptxas caps these small kernels near 40 registers and
// spills instead of keeping a batch of loads in flight.
extern "C" __global__ void __launch_bounds__(KernelConfig::kCombineThreads, 1)
    fj_combine(const __grid_constant__ fj_combine_params p) {
  constexpr int kWarps = KernelConfig::kCombineThreads / fj::kWarpSize;
  const int warps_in_grid = (int)gridDim.x * kWarps;
  for (int row = (int)blockIdx.x * kWarps + fj::warp_id(); row < p.rows; row += warps_in_grid) {
    fj::merge_states_row<KernelConfig::kDType, KernelConfig::kHeadDimV, KernelConfig::kAligned16>(
        p.partial_o + (fj::i64)row * KernelConfig::kHeadDimV, p.state_stride_o, p.partial_lse + row, p.state_stride_lse,
        p.num_states, static_cast<fj::u16 *>(p.o) + row * p.o_row_stride,
        p.maybe_lse == nullptr ? nullptr : p.maybe_lse + row);
  }
}
