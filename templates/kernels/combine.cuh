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

// One warp merges one row; every lane owns chunks of kMergeChunk consecutive columns, so an
// aligned output chunk is one 16-byte store of eight 16-bit values.
constexpr int kMergeChunk = 8;
constexpr int kF32PerVec = 4;

template <int HeadDimV> struct MergeShape {
  static_assert(HeadDimV % kMergeChunk == 0, "head_dim_v must be a multiple of 8");
  static constexpr int kChunks = HeadDimV / kMergeChunk;
  static constexpr int kChunksPerLane = (kChunks + kWarpSize - 1) / kWarpSize;
};

// Largest LSE over `count` states (lanes stride over the states, then a warp reduction).
__device__ __forceinline__ float states_max_lse(const float *lse, i64 stride, int count) {
  float best = neg_inf();
  for (int s = lane_id(); s < count; s += kWarpSize)
    best = max_f32(best, ld_global_nc_f32(lse + s * stride));
  return warp_reduce_max(best);
}

// sum_i 2^((LSE_i - max) * log2 e); 0 when max = -inf (the caller then writes the empty row).
__device__ __forceinline__ float states_sum_exp(const float *lse, i64 stride, int count, float max_lse) {
  float sum = 0.f;
  for (int s = lane_id(); s < count; s += kWarpSize)
    sum += ex2_approx((ld_global_nc_f32(lse + s * stride) - max_lse) * kLog2e);
  return warp_reduce_sum(sum);
}

// Writes eight fp32 values as 16-bit elements, 16 bytes at once when the row is 16-byte aligned.
template <int DType, bool Aligned16> __device__ __forceinline__ void store_chunk16(void *out, const float (&v)[kMergeChunk]) {
  if constexpr (Aligned16) {
    u32 packed[kMergeChunk / 2];
#pragma unroll
    for (int i = 0; i < kMergeChunk / 2; ++i)
      packed[i] = pack2_from_f32<DType>(v[2 * i], v[2 * i + 1]);
    st_global_v4_b32(out, packed);
  } else {
#pragma unroll
    for (int i = 0; i < kMergeChunk; ++i)
      st_global_b16(static_cast<u16 *>(out) + i, from_f32<DType>(v[i]));
  }
}

// Merges `count` states of one row (warp-wide). `o_states` points at state 0's row (16-byte
// aligned, fp32), `o_stride` / `lse_stride` step between states; `out_row` receives 16-bit values.
template <int DType, int HeadDimV, bool Aligned16>
__device__ __forceinline__ void merge_states_row(const float *o_states, i64 o_stride, const float *lse_states,
                                                 i64 lse_stride, int count, void *out_row, float *maybe_out_lse) {
  using Shape = MergeShape<HeadDimV>;
  const float max_lse = states_max_lse(lse_states, lse_stride, count);
  const bool empty = max_lse == neg_inf();
  const float sum = empty ? 0.f : states_sum_exp(lse_states, lse_stride, count, max_lse);
  const float inv_sum = empty ? 0.f : rcp_approx(sum);

  float acc[Shape::kChunksPerLane][kMergeChunk] = {};
  if (!empty) {
    for (int s = 0; s < count; ++s) {
      const float lse = ld_global_nc_f32(lse_states + s * lse_stride);
      const float weight = ex2_approx((lse - max_lse) * kLog2e) * inv_sum;
      if (weight == 0.f) // an empty state, or one too small to matter: its O may be anything
        continue;
#pragma unroll
      for (int c = 0; c < Shape::kChunksPerLane; ++c) {
        const int chunk = lane_id() + c * kWarpSize;
        if (chunk < Shape::kChunks) {
          const float *src = o_states + s * o_stride + chunk * kMergeChunk;
#pragma unroll
          for (int h = 0; h < kMergeChunk / kF32PerVec; ++h) {
            float v[kF32PerVec];
            ld_global_nc_v4_f32(v, src + h * kF32PerVec);
#pragma unroll
            for (int i = 0; i < kF32PerVec; ++i)
              acc[c][h * kF32PerVec + i] += weight * v[i];
          }
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < Shape::kChunksPerLane; ++c) {
    const int chunk = lane_id() + c * kWarpSize;
    if (chunk < Shape::kChunks)
      store_chunk16<DType, Aligned16>(static_cast<u16 *>(out_row) + chunk * kMergeChunk, acc[c]);
  }
  if (maybe_out_lse != nullptr && lane_id() == 0)
    st_global_f32(maybe_out_lse, empty ? neg_inf() : max_lse + lg2_approx(sum) * kLn2);
}

} // namespace fj

// Standalone merge: rows x num_states states, one warp per row, grid-stride over the rows.
extern "C" __global__ void __launch_bounds__(KernelConfig::kCombineThreads)
    fj_combine(const __grid_constant__ fj_combine_params p) {
  constexpr int kWarps = KernelConfig::kCombineThreads / fj::kWarpSize;
  const int warps_in_grid = (int)gridDim.x * kWarps;
  for (int row = (int)blockIdx.x * kWarps + fj::warp_id(); row < p.rows; row += warps_in_grid) {
    fj::merge_states_row<KernelConfig::kDType, KernelConfig::kHeadDimV, KernelConfig::kAligned16>(
        p.partial_o + (fj::i64)row * KernelConfig::kHeadDimV, p.state_stride_o, p.partial_lse + row,
        p.state_stride_lse, p.num_states, static_cast<fj::u16 *>(p.o) + row * p.o_row_stride,
        p.maybe_lse == nullptr ? nullptr : p.maybe_lse + row);
  }
}
