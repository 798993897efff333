// Scores -> probabilities in the fa2 prefill kernel, the step between gemm_qk and gemm_pv: the
// logits' scale (or softcap), the mask (seqlen_k, causal / window band), the online softmax update of
// O and the row statistics, and P's 16-bit A fragments; scores_to_p runs them on a warp's row blocks.
#pragma once

#include "kernel_params.h"
#include "kernels/fa2/tile.cuh"
#include "kernels/fa2/traits.cuh"
#include "prim/math.cuh"
#include "prim/types.cuh"
#include "prim/warp.cuh"

namespace fj::fa2 {

// Logits in log2 units: s * scale * log2(e), or with a softcap cap * tanh(s * scale / cap) * log2(e).
__device__ __forceinline__ void scale_logits(float (&s)[kTilesN][4], const fj_attention_params &p) {
#pragma unroll
  for (int j = 0; j < kTilesN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (Cfg::kSoftcap)
        s[j][e] = tanh_fast(s[j][e] * (p.scale * p.softcap_inv)) * (p.softcap * kLog2e);
      else
        s[j][e] *= p.scale_log2;
    }
}

// Sets logits of keys past seqlen_k or outside the causal / window band to -inf. `row0` is the
// query row of accumulator elements 0,1 (elements 2,3 are row0 + 8).
__device__ __forceinline__ void mask_logits(float (&s)[kTilesN][4], const Tile &t, int row0, int n0) {
  const int col_base = n0 + (lane_id() % kQuadSize) * 2;
  // Every element's distance from its row's diagonal is this one value plus a constant, so the
  // key loop carries one register for the band (not one bound per row, as hoisted per-row
  // diagonals would).
  const int from_diag = col_base - (row0 + t.shift);
#pragma unroll
  for (int j = 0; j < kTilesN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = col_base + j * kMmaN + (e % 2);
      const int dist = from_diag + j * kMmaN + (e % 2) - (e / 2) * 8; // col - (row + shift)
      bool masked = col >= t.seqlen_k;
      if (t.right >= 0)
        masked |= dist > t.right;
      if (t.left >= 0)
        masked |= dist < -t.left;
      if (masked)
        s[j][e] = neg_inf();
    }
}

// Online softmax over one key block of one m16 row block: updates the running max / (thread-
// partial) sum of the two rows this thread holds, rescales O, and turns S into P in place (log2
// units -> probabilities). With kFoldScale, S and the running max are raw Q K^T and `scale_log2`
// is applied inside the exponent.
__device__ __forceinline__ void softmax_update(float (&s)[kTilesN][4], float (&o)[kTilesDV][4], float (&row_max)[2],
                                               float (&row_sum)[2], float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float block_max = neg_inf();
#pragma unroll
    for (int j = 0; j < kTilesN; ++j)
      block_max = max_f32(block_max, max_f32(s[j][2 * r], s[j][2 * r + 1]));
    const float new_max = max_f32(row_max[r], quad_reduce_max(block_max));
    // A row that has seen only masked keys keeps max -inf; exponentiate against 0 so that
    // exp2(-inf - -inf) never produces NaN (every p is then exp2(-inf) = 0).
    float ref, correction;
    if constexpr (kFoldScale) {
      ref = new_max == neg_inf() ? 0.0f : new_max * scale_log2;
      correction = ex2_approx(fma_rn_f32(row_max[r], scale_log2, -ref));
    } else {
      ref = new_max == neg_inf() ? 0.0f : new_max;
      correction = ex2_approx(row_max[r] - ref);
    }
    row_max[r] = new_max;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
      if constexpr (kFoldScale) {
        s[j][2 * r] = ex2_approx(fma_rn_f32(s[j][2 * r], scale_log2, -ref));
        s[j][2 * r + 1] = ex2_approx(fma_rn_f32(s[j][2 * r + 1], scale_log2, -ref));
      } else {
        s[j][2 * r] = ex2_approx(s[j][2 * r] - ref);
        s[j][2 * r + 1] = ex2_approx(s[j][2 * r + 1] - ref);
      }
      sum += s[j][2 * r] + s[j][2 * r + 1];
    }
    row_sum[r] = row_sum[r] * correction + sum;
#pragma unroll
    for (int d = 0; d < kTilesDV; ++d) {
      o[d][2 * r] *= correction;
      o[d][2 * r + 1] *= correction;
    }
  }
}

// P (fp32 accumulators) -> 16-bit A fragments of P V.
__device__ __forceinline__ void pack_p(u32 (&pf)[kStepsPV][4], const float (&s)[kTilesN][4]) {
#pragma unroll
  for (int kk = 0; kk < kStepsPV; ++kk) {
    pf[kk][0] = pack2_from_f32<Cfg::kDType>(s[2 * kk][0], s[2 * kk][1]);
    pf[kk][1] = pack2_from_f32<Cfg::kDType>(s[2 * kk][2], s[2 * kk][3]);
    pf[kk][2] = pack2_from_f32<Cfg::kDType>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pf[kk][3] = pack2_from_f32<Cfg::kDType>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// Scores of one key block -> probabilities: scale (or softcap), mask where the block needs it,
// online softmax update of O and the row statistics, 16-bit P fragments, for every row block.
__device__ __forceinline__ void scores_to_p(u32 (&pf)[kMBlocks][kStepsPV][4], float (&s)[kMBlocks][kTilesN][4],
                                            float (&o)[kMBlocks][kTilesDV][4], float (&row_max)[kMBlocks][2],
                                            float (&row_sum)[kMBlocks][2], const fj_attention_params &p, const Tile &t,
                                            int row0, int n0) {
  if constexpr (!kFoldScale) {
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb)
      scale_logits(s[mb], p);
  }
  // Only blocks that cross seqlen_k or an edge of the band pay for the mask.
  const bool crosses_end = n0 + Cfg::kSubBlockN > t.seqlen_k;
  const bool crosses_right = t.right >= 0 && n0 + Cfg::kSubBlockN - 1 > t.m0 + t.shift + t.right;
  const bool crosses_left = t.left >= 0 && n0 < t.m0 + Cfg::kBlockM - 1 + t.shift - t.left;
  const bool needs_mask = crosses_end || crosses_right || crosses_left;
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb) {
    if (needs_mask)
      mask_logits(s[mb], t, row0 + mb * kMmaM, n0);
    softmax_update(s[mb], o[mb], row_max[mb], row_sum[mb], p.scale_log2);
    pack_p(pf[mb], s[mb]);
  }
}

} // namespace fj::fa2
