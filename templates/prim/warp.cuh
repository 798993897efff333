// Warp-level shuffles and reductions (shfl.sync.bfly), lane and warp indices.
#pragma once

#include "prim/math.cuh"
#include "prim/types.cuh"

namespace fj {

constexpr int kWarpSize = 32;
constexpr u32 kFullMask = 0xffffffffu;
// mma.sync fragments spread a row over the 4 lanes of a quad (lanes 4g..4g+3).
constexpr int kQuadSize = 4;

__device__ __forceinline__ int lane_id() {
  return (int)(threadIdx.x % kWarpSize);
}
__device__ __forceinline__ int warp_id() {
  return (int)(threadIdx.x / kWarpSize);
}

// shfl.sync.bfly.b32 d, a, lane_mask, 0x1f, membermask — value from lane (lane ^ lane_mask).
__device__ __forceinline__ float shfl_xor_sync(float value, int lane_mask, u32 member_mask = kFullMask) {
  constexpr int kClamp = 0x1f;
  float out;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, %3, %4;"
               : "=f"(out)
               : "f"(value), "r"(lane_mask), "r"(kClamp), "r"(member_mask));
  return out;
}

// vote.sync.any.pred q, p, membermask — whether `pred` holds on any lane (the same on every lane).
__device__ __forceinline__ bool vote_any_sync(bool pred, u32 member_mask = kFullMask) {
  u32 out;
  asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n vote.sync.any.pred q, p, %2;\n selp.u32 %0, 1, 0, q;\n}"
               : "=r"(out)
               : "r"(static_cast<u32>(pred)), "r"(member_mask));
  return out != 0;
}

// redux.sync.or.b32 d, a, membermask — the OR of `value` over the warp. Its SASS (REDUX) writes a
// uniform register, so ptxas knows the result is the same on every lane: a branch on it keeps the
// code after it on the uniform datapath (wgmma descriptors in uniform registers), where a branch on
// a value it cannot prove uniform moves them to ordinary registers and an R2UR before every GEMM.
__device__ __forceinline__ u32 redux_or_sync(u32 value, u32 member_mask = kFullMask) {
  u32 out;
  asm volatile("redux.sync.or.b32 %0, %1, %2;" : "=r"(out) : "r"(value), "r"(member_mask));
  return out;
}

// Max / sum over the Width lanes of an aligned group (Width a power of two up to 32).
template <int Width = kWarpSize> __device__ __forceinline__ float group_reduce_max(float value) {
#pragma unroll
  for (int offset = Width / 2; offset > 0; offset /= 2)
    value = max_f32(value, shfl_xor_sync(value, offset));
  return value;
}

template <int Width = kWarpSize> __device__ __forceinline__ float group_reduce_sum(float value) {
#pragma unroll
  for (int offset = Width / 2; offset > 0; offset /= 2)
    value += shfl_xor_sync(value, offset);
  return value;
}

// The two most common widths, named.
__device__ __forceinline__ float quad_reduce_max(float value) {
  return group_reduce_max<kQuadSize>(value);
}
__device__ __forceinline__ float quad_reduce_sum(float value) {
  return group_reduce_sum<kQuadSize>(value);
}
__device__ __forceinline__ float warp_reduce_max(float value) {
  return group_reduce_max<kWarpSize>(value);
}
__device__ __forceinline__ float warp_reduce_sum(float value) {
  return group_reduce_sum<kWarpSize>(value);
}

} // namespace fj
