// The warp GEMMs of the fa2 prefill kernel on mma.sync m16n8k16: S = Q K^T (gemm_qk) and O += P V
// (gemm_pv), their Q, K and V fragments read from shared memory by ldmatrix.
#pragma once

#include "kernels/fa2/traits.cuh"
#include "prim/ldmatrix.cuh"
#include "prim/mma.cuh"
#include "prim/types.cuh"
#include "prim/warp.cuh"

namespace fj::fa2 {

// This lane's byte offset for ldmatrix x4 over a 16x16 tile of rows `Stride` elements apart: lanes
// 0-15 name rows 0-15 of columns 0-7, lanes 16-31 the same rows at column 8. Q and V (transposed)
// share it when their strides agree, so one register serves both across the key loop.
template <int Stride> __device__ __forceinline__ u32 ldmatrix_lane_offset() {
  const int lane = lane_id();
  return ((lane % kMmaM) * Stride + (lane / kMmaM) * kHalfMmaK) * kElemBytes;
}

// S = Q K^T for this warp's kRowsPerWarp rows and the kSubBlockN keys at `smem_k` (shared window
// addresses: a generic pointer would carry 64 bits through the key loop); each K fragment is
// loaded once and multiplied into every m16 row block.
__device__ __forceinline__ void gemm_qk(float (&s)[kMBlocks][kTilesN][4], u32 smem_q_warp, u32 smem_k) {
  // ldmatrix row pointers: A (Q) matrices go rows 0-7 / 8-15 then columns 0-7 / 8-15
  // (ldmatrix_lane_offset); each x4 of K covers two n8 key tiles (keys 0-7 then 8-15), columns 0-7 /
  // 8-15 within each, so each tile's B pair lands in consecutive registers (another matrix order
  // costs two register moves per MMA pair).
  const int lane = lane_id();
  const u32 q_addr = smem_q_warp + ldmatrix_lane_offset<Cfg::kSmemStrideQ>();
  const u32 k_addr = smem_k + (((lane % 8) + (lane / 16) * 8) * Cfg::kSmemStrideK + ((lane / 8) % 2) * 8) * kElemBytes;
  constexpr u32 kQBlockBytes = kMmaM * Cfg::kSmemStrideQ * kElemBytes; // one m16 row block of Q
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
    for (int j = 0; j < kTilesN; ++j)
      s[mb][j][0] = s[mb][j][1] = s[mb][j][2] = s[mb][j][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kStepsQK; ++kk) {
    u32 a[kMBlocks][4];
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb)
      ldmatrix_x4(a[mb], q_addr + mb * kQBlockBytes + kk * kMmaK * kElemBytes);
#pragma unroll
    for (int jj = 0; jj < kTilesN / 2; ++jj) {
      u32 b[4];
      ldmatrix_x4(b, k_addr + (jj * 2 * kMmaN * Cfg::kSmemStrideK + kk * kMmaK) * kElemBytes);
      const u32 b_lo[2] = {b[0], b[1]};
      const u32 b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb) {
        mma_m16n8k16<Cfg::kDType>(s[mb][2 * jj], a[mb], b_lo);
        mma_m16n8k16<Cfg::kDType>(s[mb][2 * jj + 1], a[mb], b_hi);
      }
    }
  }
}

// O += P V, with P taken from the S accumulators (the C layout of two n8 tiles is the A layout
// of one k16 step) and V read transposed by ldmatrix.trans; each V fragment feeds every row block.
__device__ __forceinline__ void gemm_pv(float (&o)[kMBlocks][kTilesDV][4], const u32 (&pf)[kMBlocks][kStepsPV][4],
                                        u32 smem_v) {
  const u32 v_addr = smem_v + ldmatrix_lane_offset<Cfg::kSmemStrideV>();
#pragma unroll
  for (int kk = 0; kk < kStepsPV; ++kk) {
    const u32 row_offset = kk * kMmaK * Cfg::kSmemStrideV * kElemBytes;
#pragma unroll
    for (int jj = 0; jj < kTilesDV / 2; ++jj) {
      u32 b[4];
      ldmatrix_x4_trans(b, v_addr + row_offset + jj * 2 * kMmaN * kElemBytes);
      const u32 b_lo[2] = {b[0], b[1]};
      const u32 b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb) {
        mma_m16n8k16<Cfg::kDType>(o[mb][2 * jj], pf[mb][kk], b_lo);
        mma_m16n8k16<Cfg::kDType>(o[mb][2 * jj + 1], pf[mb][kk], b_hi);
      }
    }
    if constexpr (kTilesDV % 2 == 1) {
      // head_dim_v = 8 (mod 16): the last n8 tile alone (lanes 0-15 address keys 0-15).
      u32 b[2];
      ldmatrix_x2_trans(b, v_addr + row_offset + (kTilesDV - 1) * kMmaN * kElemBytes);
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
        mma_m16n8k16<Cfg::kDType>(o[mb][kTilesDV - 1], pf[mb][kk], b);
    }
  }
}

} // namespace fj::fa2
