// The warps' math in the split-K decode kernel: the logits (softcap's tanh, the keys a packed row
// may see), the online softmax state of a warp (O, row max, row sum), Q's A fragments (held in
// registers when they fit: kHoldQ), the mma.sync GEMMs S = Q K^T and O += P V, and the online
// softmax step between them.
#pragma once

#include "kernel_params.h"
#include "kernels/decode/smem.cuh"
#include "kernels/decode/traits.cuh"
#include "kernels/decode/work.cuh"
#include "prim/ldmatrix.cuh"
#include "prim/math.cuh"
#include "prim/mma.cuh"
#include "prim/types.cuh"
#include "prim/warp.cuh"

namespace fj::decode {

// ---- logits --------------------------------------------------------------------------------------

// tanh through 2^x: 1 - 2 / (e^{2|y|} + 1) keeps ~1e-7 relative error, unlike tanh.approx (2^-11),
// which a softcap of 30 would turn into 1e-2 errors on the logits.
__device__ __forceinline__ float tanh_accurate(float y) {
  constexpr float kTwoLog2e = 2.f * kLog2e;
  const float a = y < 0.f ? -y : y;
  const float t = 1.f - 2.f * rcp_approx(ex2_approx(a * kTwoLog2e) + 1.f);
  return y < 0.f ? -t : t;
}

// Keys a packed row may see: [lo, hi). Causal and window are aligned to the end of the sequence
// (query token i of q_len sees key j <= i + kv_len - q_len); hi also stops at the piece's end.
struct RowRange {
  int lo, hi;
};

__device__ __forceinline__ RowRange row_range(const fj_attention_params &a, const Unit &u, int row_in_block) {
  const int token = (u.m_block * Cfg::kBlockM + row_in_block) / Cfg::kGqaGroup;
  const int diag = token + u.kv_len - a.seqlen_q; // the last key the causal mask admits
  RowRange r{u.kv_begin, u.kv_end};
  if constexpr (Cfg::kCausal)
    r.hi = min(r.hi, diag + 1);
  if constexpr (Cfg::kLocal) {
    if (a.window_left >= 0)
      r.lo = max(r.lo, diag - a.window_left);
    if (a.window_right >= 0)
      r.hi = min(r.hi, diag + a.window_right + 1);
  }
  return r;
}

// ---- the per-warp online softmax state ----------------------------------------------------------

struct WarpState {
  float o[Traits::kMTiles][Traits::kNTilesO][4];
  float row_max[Traits::kMTiles][kRowsPerThreadTile]; // base-2 logits
  float row_sum[Traits::kMTiles][kRowsPerThreadTile]; // this thread's partial sum; quad-reduced at the end

  __device__ void reset() {
#pragma unroll
    for (int m = 0; m < Traits::kMTiles; ++m) {
#pragma unroll
      for (int n = 0; n < Traits::kNTilesO; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          o[m][n][e] = 0.f;
#pragma unroll
      for (int h = 0; h < kRowsPerThreadTile; ++h) {
        row_max[m][h] = neg_inf();
        row_sum[m][h] = 0.f;
      }
    }
  }
};

// Q's A fragments of one k step: matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15), row-half first.
__device__ __forceinline__ void load_q_fragments(const Smem &smem, int ks, u32 (&a)[Traits::kMTiles][4]) {
  const int matrix = lane_id() / kHalfTile;
  const int row8 = lane_id() % kHalfTile;
  const u32 q_base = cvta_to_shared_u32(smem.q());
#pragma unroll
  for (int m = 0; m < Traits::kMTiles; ++m) {
    const int row = m * kMmaM + (matrix % 2) * kHalfTile + row8;
    const int col = ks * kMmaK + (matrix / 2) * kHalfTile;
    ldmatrix_x4(a[m], q_base + (row * Cfg::kSmemRowQK + col) * kElemBytes);
  }
}

// Q's A fragments of every k step, loaded once per piece instead of once per tile when they fit
// kMaxHeldQRegisters (head dims up to 128): the per-tile ldmatrix of Q cost as much shared-memory
// traffic as the tile's K reads (held: +0.05..1.0% on every TARGETS shape, runs 17a-b; at head dim
// 256 they would take 64 registers of a kernel near the 255 cap).
constexpr int kMaxHeldQRegisters = 32;
using QFragments = u32[Traits::kKStepsQK][Traits::kMTiles][4];
constexpr bool kHoldQ = sizeof(QFragments) / sizeof(u32) <= kMaxHeldQRegisters;

// S = Q K^T for this warp's kWarpN keys of the tile in `stage`; q_fragments(ks, a) fills Q's A
// fragments of k step ks.
template <class QFragmentSource>
__device__ __forceinline__ void qk_gemm(const Smem &smem, int stage, float (&s)[Traits::kMTiles][Traits::kNTilesS][4],
                                        const QFragmentSource &q_fragments) {
  const int lane = lane_id();
  const int matrix = lane / kHalfTile;
  const int row8 = lane % kHalfTile;
  const u32 k_base = cvta_to_shared_u32(smem.k(stage) + warp_id() * Cfg::kWarpN * Cfg::kSmemRowQK);
  const u32 k_stage = cvta_to_shared_u32(smem.k(stage)); // TMA tiles
#pragma unroll
  for (int m = 0; m < Traits::kMTiles; ++m)
#pragma unroll
    for (int n = 0; n < Traits::kNTilesS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[m][n][e] = 0.f;
#pragma unroll
  for (int ks = 0; ks < Traits::kKStepsQK; ++ks) {
    u32 a[Traits::kMTiles][4];
    q_fragments(ks, a);
    // B (K rows are the n axis): matrices (keys 0-7: k 0-7, k 8-15), (keys 8-15: k 0-7, k 8-15).
#pragma unroll
    for (int np = 0; np < Traits::kNTilesS / 2; ++np) {
      const int key = np * 2 * kMmaN + (matrix / 2) * kHalfTile + row8;
      const int col = ks * kMmaK + (matrix % 2) * kHalfTile;
      u32 b[4];
      if constexpr (kTmaKv)
        ldmatrix_x4(b, k_stage + TmaTile::offset(warp_id() * Cfg::kWarpN + key, col));
      else
        ldmatrix_x4(b, k_base + (key * Cfg::kSmemRowQK + col) * kElemBytes);
      const u32 b0[2] = {b[0], b[1]};
      const u32 b1[2] = {b[2], b[3]};
#pragma unroll
      for (int m = 0; m < Traits::kMTiles; ++m) {
        mma_m16n8k16<Cfg::kDType>(s[m][2 * np], a[m], b0);
        mma_m16n8k16<Cfg::kDType>(s[m][2 * np + 1], a[m], b1);
      }
    }
  }
}

// O += P V for this warp's keys; P arrives as C fragments and is repacked into A fragments.
__device__ __forceinline__ void pv_gemm(const Smem &smem, int stage,
                                        const float (&p)[Traits::kMTiles][Traits::kNTilesS][4], WarpState &st) {
  const int lane = lane_id();
  const int matrix = lane / kHalfTile;
  const int row8 = lane % kHalfTile;
  const u32 v_base = cvta_to_shared_u32(smem.v(stage) + warp_id() * Cfg::kWarpN * Cfg::kSmemRowV);
  const u32 v_stage = cvta_to_shared_u32(smem.v(stage)); // TMA tiles
#pragma unroll
  for (int ks = 0; ks < Traits::kKStepsPV; ++ks) {
    u32 a[Traits::kMTiles][4];
#pragma unroll
    for (int m = 0; m < Traits::kMTiles; ++m) {
      a[m][0] = pack2_from_f32<Cfg::kDType>(p[m][2 * ks][0], p[m][2 * ks][1]);
      a[m][1] = pack2_from_f32<Cfg::kDType>(p[m][2 * ks][2], p[m][2 * ks][3]);
      a[m][2] = pack2_from_f32<Cfg::kDType>(p[m][2 * ks + 1][0], p[m][2 * ks + 1][1]);
      a[m][3] = pack2_from_f32<Cfg::kDType>(p[m][2 * ks + 1][2], p[m][2 * ks + 1][3]);
    }
    // B (V, transposed on load): matrices (keys 0-7 | 8-15) x (dv 0-7 | 8-15), key-half first.
#pragma unroll
    for (int np = 0; np < Traits::kNTilesO / 2; ++np) {
      const int key = ks * kMmaK + (matrix % 2) * kHalfTile + row8;
      const int col = np * 2 * kMmaN + (matrix / 2) * kHalfTile;
      u32 b[4];
      if constexpr (kTmaKv)
        ldmatrix_x4_trans(b, v_stage + TmaTile::offset(warp_id() * Cfg::kWarpN + key, col));
      else
        ldmatrix_x4_trans(b, v_base + (key * Cfg::kSmemRowV + col) * kElemBytes);
      const u32 b0[2] = {b[0], b[1]};
      const u32 b1[2] = {b[2], b[3]};
#pragma unroll
      for (int m = 0; m < Traits::kMTiles; ++m) {
        mma_m16n8k16<Cfg::kDType>(st.o[m][2 * np], a[m], b0);
        mma_m16n8k16<Cfg::kDType>(st.o[m][2 * np + 1], a[m], b1);
      }
    }
    if constexpr (Traits::kNTilesO % 2 == 1) { // head_dim_v = 8 mod 16: one n8 tile left
      constexpr int kLast = Traits::kNTilesO - 1;
      const int key = ks * kMmaK + (matrix % 2) * kHalfTile + row8; // lanes 0-15 address
      u32 b[2];
      ldmatrix_x2_trans(b, v_base + (key * Cfg::kSmemRowV + kLast * kMmaN) * kElemBytes);
#pragma unroll
      for (int m = 0; m < Traits::kMTiles; ++m)
        mma_m16n8k16<Cfg::kDType>(st.o[m][kLast], a[m], b);
    }
  }
}

// Scales and masks S into base-2 logits, updates the running max/sum, rescales O, and leaves
// P = 2^(logit - max) in `s`.
__device__ __forceinline__ void online_softmax(const fj_attention_params &a,
                                               float (&s)[Traits::kMTiles][Traits::kNTilesS][4],
                                               const RowRange (&ranges)[Traits::kMTiles][kRowsPerThreadTile],
                                               int tile_key, WarpState &st) {
  const int quad_col = 2 * (lane_id() % kQuadSize);
  const int warp_key = tile_key + warp_id() * Cfg::kWarpN;
#pragma unroll
  for (int m = 0; m < Traits::kMTiles; ++m) {
#pragma unroll
    for (int h = 0; h < kRowsPerThreadTile; ++h) {
      const RowRange range = ranges[m][h];
      float tile_max = neg_inf();
#pragma unroll
      for (int n = 0; n < Traits::kNTilesS; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float x = s[m][n][2 * h + e];
          if constexpr (Cfg::kSoftcap)
            x = tanh_accurate(x * a.scale * a.softcap_inv) * (a.softcap * kLog2e);
          else
            x *= a.scale_log2;
          const int key = warp_key + n * kMmaN + quad_col + e;
          x = key >= range.lo && key < range.hi ? x : neg_inf();
          s[m][n][2 * h + e] = x;
          tile_max = max_f32(tile_max, x);
        }
      }
      tile_max = quad_reduce_max(tile_max);
      const float new_max = max_f32(st.row_max[m][h], tile_max);
      // A row that has seen no key yet keeps max = -inf; subtract 0 so that -inf - -inf never occurs.
      const float shift = new_max == neg_inf() ? 0.f : new_max;
      const float correction = ex2_approx(st.row_max[m][h] - shift);
      st.row_max[m][h] = new_max;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < Traits::kNTilesS; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float prob = ex2_approx(s[m][n][2 * h + e] - shift);
          s[m][n][2 * h + e] = prob;
          sum += prob;
        }
      }
      st.row_sum[m][h] = st.row_sum[m][h] * correction + sum;
#pragma unroll
      for (int n = 0; n < Traits::kNTilesO; ++n) {
        st.o[m][n][2 * h] *= correction;
        st.o[m][n][2 * h + 1] *= correction;
      }
    }
  }
}

} // namespace fj::decode
