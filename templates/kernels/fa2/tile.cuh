// The per-CTA view of the fa2 prefill kernel: Tile (one query block of one (batch, head): lengths,
// mask bounds, base pointers), the integer helpers, and make_tile, which builds the view from the
// CTA's grid position and the parameter block.
#pragma once

#include "kernel_params.h"
#include "kernels/fa2/traits.cuh"
#include "prim/types.cuh"

namespace fj::fa2 {

// The per-CTA view of the problem: lengths, the mask bounds and base pointers (head applied).
struct Tile {
  int batch, head, head_kv;
  int m0; // first query row of this tile
  int seqlen_q, seqlen_k;
  int shift;            // seqlen_k - seqlen_q: bottom-right alignment of causal / window
  int left, right;      // window reach to the left / right of the diagonal; < 0 = unbounded
  i64 q_row0, k_row0;   // first packed row (varlen) of this sequence
  const u16 *q, *k, *v; // row 0 of this (batch, head); k/v = page 0 of the head when paged
  u16 *o;
};

__device__ __forceinline__ int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}
__device__ __forceinline__ int min_i(int a, int b) {
  return a < b ? a : b;
}
__device__ __forceinline__ int max_i(int a, int b) {
  return a > b ? a : b;
}

// Builds the CTA's view; returns false when the tile lies past the end of its sequence (varlen
// grids are sized for the longest one).
__device__ __forceinline__ bool make_tile(const fj_attention_params &p, Tile *t) {
  t->batch = blockIdx.z;
  t->head = blockIdx.y;
  t->head_kv = t->head / p.group;
  // Causal: the last query block sees the most keys. The hardware hands out CTAs in blockIdx
  // order, so taking the query blocks from the end puts the heavy tiles first and leaves light
  // ones for the tail of the grid.
  const int m_block = Cfg::kCausal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
  t->m0 = m_block * Cfg::kBlockM;
  if constexpr (Cfg::kVarlen) {
    t->q_row0 = p.maybe_cu_seqlens_q[t->batch];
    t->seqlen_q = p.maybe_cu_seqlens_q[t->batch + 1] - (int)t->q_row0;
  } else {
    t->q_row0 = 0;
    t->seqlen_q = p.seqlen_q;
  }
  if (t->m0 >= t->seqlen_q)
    return false;
  const bool cu_k = Cfg::kVarlen && p.maybe_cu_seqlens_k != nullptr;
  t->k_row0 = cu_k ? p.maybe_cu_seqlens_k[t->batch] : 0;
  if (p.maybe_seqlens_k != nullptr)
    t->seqlen_k = p.maybe_seqlens_k[t->batch];
  else if (cu_k)
    t->seqlen_k = p.maybe_cu_seqlens_k[t->batch + 1] - (int)t->k_row0;
  else
    t->seqlen_k = p.seqlen_k;
  t->shift = t->seqlen_k - t->seqlen_q;
  // Causal is the window (inf, 0); a user window intersects with it.
  t->right = Cfg::kCausal ? 0 : -1;
  t->left = -1;
  if constexpr (Cfg::kLocal) {
    if (p.window_right >= 0)
      t->right = t->right < 0 ? p.window_right : min_i(t->right, p.window_right);
    t->left = p.window_left;
  }

  const i64 q_off = Cfg::kVarlen ? t->q_row0 * p.q.row_stride : (i64)t->batch * p.q.batch_stride;
  const i64 o_off = Cfg::kVarlen ? t->q_row0 * p.o.row_stride : (i64)t->batch * p.o.batch_stride;
  t->q = (const u16 *)p.q.ptr + q_off + (i64)t->head * p.q.head_stride;
  t->o = (u16 *)p.o.ptr + o_off + (i64)t->head * p.o.head_stride;
  i64 k_off = 0, v_off = 0;
  if constexpr (Cfg::kPageSize == 0) {
    k_off = Cfg::kVarlen ? t->k_row0 * p.k.row_stride : (i64)t->batch * p.k.batch_stride;
    v_off = Cfg::kVarlen ? t->k_row0 * p.v.row_stride : (i64)t->batch * p.v.batch_stride;
  }
  t->k = (const u16 *)p.k.ptr + k_off + (i64)t->head_kv * p.k.head_stride;
  t->v = (const u16 *)p.v.ptr + v_off + (i64)t->head_kv * p.v.head_stride;
  return true;
}

} // namespace fj::fa2
