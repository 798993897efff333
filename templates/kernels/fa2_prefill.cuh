// FlashAttention-2 forward (prefill) on mma.sync: runs on sm_80, sm_86, sm_89 and sm_90.
//
// One CTA computes kBlockM query rows of one (batch, head); each warp owns kRowsPerWarp rows, 16
// or 32 (one or two m16 MMA row blocks), so softmax statistics never leave a warp. With 32 rows
// every K / V fragment a warp loads with ldmatrix feeds two MMAs instead of one, halving the
// shared-memory reads per MMA, and the non-softcap logits skip their scaling pass (the scale is
// folded into the exponent's FFMA; see kFoldScale). Key/value blocks of kBlockN
// rows stream through kStages shared-memory buffers each, filled with cp.async (16-byte path) or
// predicated element loads (unaligned path). Two schedules, chosen by kStages:
//   kStages >= 2 (ring): wait K_j, V_j -> refill the buffers of block j-1 with block j+kStages-1
//     -> per sub-block of kSubBlockN keys: S = Q K^T -> mask, online softmax -> O += P V.
//     One barrier per block.
//   kStages == 1 (one buffer each, for small shared memory): wait K_j -> S = Q K_j^T -> refill K
//     -> softmax -> wait V_j -> O += P V_j -> refill V; each load overlaps half a block of math.
// Commit groups go in the fixed order Q, K0, V0, K1, V1, ..., one (possibly empty) group per load,
// so "block j landed" is always the same cp.async.wait_group count (kGroupsInFlight).
//
// Every tile constant (tiles, warps, strides, offsets, padded head dim) comes from the plan
// through KernelConfig; the kernel only checks them with static_asserts.
#pragma once

#include "kernel_params.h"
#include "prim/cp_async.cuh"
#include "prim/math.cuh"
#include "prim/types.cuh"
#include "prim/warp.cuh"

// The parts, in the order they build on each other (kernels/fa2/, each including what it uses):
// traits; the CTA's tile; the generic copies (Q, element-aligned K/V); the K/V stream of 16-byte
// rows; the warp GEMMs; the softmax step between them; the output side.
// clang-format off
#include "kernels/fa2/traits.cuh"
#include "kernels/fa2/tile.cuh"
#include "kernels/fa2/loads.cuh"
#include "kernels/fa2/kv_stream.cuh"
#include "kernels/fa2/gemm.cuh"
#include "kernels/fa2/softmax.cuh"
#include "kernels/fa2/epilogue.cuh"
// clang-format on

extern "C" __global__ void __launch_bounds__(KernelConfig::kThreads, 1)
    fj_fa2_prefill(const __grid_constant__ fj_attention_params p) {
  using namespace fj;
  using namespace fj::fa2;

  Tile t;
  if (!make_tile(p, &t))
    return;

  // Key blocks [n_begin, n_end) that intersect the band of some row of this tile.
  const int m_last = min_i(t.m0 + Cfg::kBlockM, t.seqlen_q) - 1;
  int key_end = t.seqlen_k;
  if (t.right >= 0)
    key_end = min_i(key_end, m_last + t.shift + t.right + 1);
  const int key_begin = t.left >= 0 ? max_i(0, t.m0 + t.shift - t.left) : 0;
  const int n_begin = key_begin / Cfg::kBlockN;
  const int n_end = key_end > key_begin ? ceil_div(key_end, Cfg::kBlockN) : n_begin;
  if (n_end <= n_begin) {
    write_empty_tile(p, t);
    return;
  }

  extern __shared__ __align__(16) u8 smem[];
  u16 *smem_q = (u16 *)(smem + Cfg::kSmemOffsetQ);
  u16 *smem_k = (u16 *)(smem + Cfg::kSmemOffsetK);
  u16 *smem_v = (u16 *)(smem + Cfg::kSmemOffsetV);
  u16 *smem_o = (u16 *)(smem + Cfg::kSmemOffsetO);
  constexpr int kStageK = Cfg::kBlockN * Cfg::kSmemStrideK; // elements per K buffer
  constexpr int kStageV = Cfg::kBlockN * Cfg::kSmemStrideV;

  constexpr u32 kStageKBytes = kStageK * kElemBytes;
  constexpr u32 kStageVBytes = kStageV * kElemBytes;
  constexpr u32 kSubKBytes = Cfg::kSubBlockN * Cfg::kSmemStrideK * kElemBytes; // one sub-block of a buffer
  constexpr u32 kSubVBytes = Cfg::kSubBlockN * Cfg::kSmemStrideV * kElemBytes;
  const u32 smem_u32 = cvta_to_shared_u32(smem);

  zero_qk_padding(smem_q, smem_k);
  load_q(p, t, smem_q);
#pragma unroll
  for (int s = 0; s < kPrologueBlocks; ++s) {
    if constexpr (kKvStream) {
      stream_kv<false>(p, t, smem_u32 + Cfg::kSmemOffsetK + s * kStageKBytes, n_begin + s, n_end);
      stream_kv<true>(p, t, smem_u32 + Cfg::kSmemOffsetV + s * kStageVBytes, n_begin + s, n_end);
    } else {
      load_kv<false>(p, t, smem_k + s * kStageK, n_begin + s, n_end);
      load_kv<true>(p, t, smem_v + s * kStageV, n_begin + s, n_end);
    }
  }

  const int warp = warp_id();
  const int lane = lane_id();
  const u32 smem_q_warp = smem_u32 + Cfg::kSmemOffsetQ + warp * Cfg::kRowsPerWarp * Cfg::kSmemStrideQ * kElemBytes;
  const int row0 = t.m0 + warp * Cfg::kRowsPerWarp + lane / kQuadSize; // query row of c0, c1 (block 0)

  float o[kMBlocks][kTilesDV][4];
  float row_max[kMBlocks][2];
  float row_sum[kMBlocks][2];
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb) {
#pragma unroll
    for (int d = 0; d < kTilesDV; ++d)
      o[mb][d][0] = o[mb][d][1] = o[mb][d][2] = o[mb][d][3] = 0.0f;
    row_max[mb][0] = neg_inf();
    row_max[mb][1] = neg_inf();
    row_sum[mb][0] = row_sum[mb][1] = 0.0f;
  }

  for (int n_block = n_begin; n_block < n_end; ++n_block) {
    const int stage = (n_block - n_begin) % Cfg::kStages;
    const int n0 = n_block * Cfg::kBlockN;
    const u32 k_buf = smem_u32 + Cfg::kSmemOffsetK + stage * kStageKBytes;
    const u32 v_buf = smem_u32 + Cfg::kSmemOffsetV + stage * kStageVBytes;
    float s[kMBlocks][kTilesN][4];
    u32 pf[kMBlocks][kStepsPV][4];
    if constexpr (kRing) {
      cp_async_wait_group<kGroupsInFlight>();
      __syncthreads(); // K_j, V_j visible; every warp is done with block j-1, whose buffers refill
      const int ahead = n_block + Cfg::kStages - 1;
      const int ahead_stage = (ahead - n_begin) % Cfg::kStages;
      if constexpr (kKvStream) {
        stream_kv<false>(p, t, smem_u32 + Cfg::kSmemOffsetK + ahead_stage * kStageKBytes, ahead, n_end);
        stream_kv<true>(p, t, smem_u32 + Cfg::kSmemOffsetV + ahead_stage * kStageVBytes, ahead, n_end);
      } else {
        load_kv<false>(p, t, smem_k + ahead_stage * kStageK, ahead, n_end);
        load_kv<true>(p, t, smem_v + ahead_stage * kStageV, ahead, n_end);
      }
#pragma unroll 1
      for (int sub = 0; sub < kSubBlocks; ++sub) {
        gemm_qk(s, smem_q_warp, k_buf + sub * kSubKBytes);
        scores_to_p(pf, s, o, row_max, row_sum, p, t, row0, n0 + sub * Cfg::kSubBlockN);
        gemm_pv(o, pf, v_buf + sub * kSubVBytes);
      }
    } else {
      cp_async_wait_group<kGroupsInFlight>();
      __syncthreads(); // K_j (and Q) visible to every warp
      gemm_qk(s, smem_q_warp, k_buf);
      __syncthreads(); // every warp is done with the K buffer
      if constexpr (kKvStream)
        stream_kv<false>(p, t, smem_u32 + Cfg::kSmemOffsetK, n_block + 1, n_end);
      else
        load_kv<false>(p, t, smem_k, n_block + 1, n_end); // the one K buffer
      scores_to_p(pf, s, o, row_max, row_sum, p, t, row0, n0);
      cp_async_wait_group<kGroupsInFlight>();
      __syncthreads(); // V_j visible
      gemm_pv(o, pf, v_buf);
      __syncthreads(); // every warp is done with the V buffer
      if constexpr (kKvStream)
        stream_kv<true>(p, t, smem_u32 + Cfg::kSmemOffsetV, n_block + 1, n_end);
      else
        load_kv<true>(p, t, smem_v, n_block + 1, n_end);
    }
  }
  cp_async_wait_all();

  // Epilogue: normalize, stage O through shared memory for 16-byte row stores, write the LSE.
  float inv_sum[kMBlocks][2];
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = quad_reduce_sum(row_sum[mb][r]);
      inv_sum[mb][r] = sum > 0.0f ? 1.0f / sum : 0.0f;
      if (p.maybe_lse != nullptr && lane % kQuadSize == 0) {
        const int row = row0 + mb * kMmaM + r * 8;
        // The running max is in log2 units, or raw Q K^T when the scale is folded.
        const float max_log2 = kFoldScale ? row_max[mb][r] * p.scale_log2 : row_max[mb][r];
        if (row < t.seqlen_q)
          *lse_at(p, t, row) = sum > 0.0f ? (max_log2 + lg2_approx(sum)) * kLn2 : neg_inf();
      }
    }
  __syncthreads(); // the O staging area may overlap Q / K rows other warps still read
  u16 *smem_o_warp = smem_o + warp * Cfg::kRowsPerWarp * Cfg::kSmemStrideO;
  const int col = (lane % kQuadSize) * 2;
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
    for (int d = 0; d < kTilesDV; ++d)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = mb * kMmaM + lane / kQuadSize + r * 8;
        *(u32 *)(smem_o_warp + row * Cfg::kSmemStrideO + d * kMmaN + col) =
            pack2_from_f32<Cfg::kDType>(o[mb][d][2 * r] * inv_sum[mb][r], o[mb][d][2 * r + 1] * inv_sum[mb][r]);
      }
  __syncthreads();
  // The 32-row schedule recomputes the O base here rather than keep it live through the loop.
  u16 *o_base = kMBlocks > 1 ? output_base(p, t) : t.o;
  store_tile<Cfg::kBlockM, kChunksV, Cfg::kSmemStrideO>(smem_o, t.seqlen_q - t.m0, o_base + (i64)t.m0 * p.o.row_stride,
                                                        p.o.row_stride);
}
