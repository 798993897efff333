// The output side of the fa2 prefill kernel: store_tile (rows of the O tile staged in shared memory
// -> global), the LSE's address (lse_at), O and LSE of a tile whose rows see no key
// (write_empty_tile), and O's base (output_base). The entry's epilogue normalizes O and stages it.
#pragma once

#include "kernel_params.h"
#include "kernels/fa2/tile.cuh"
#include "kernels/fa2/traits.cuh"
#include "prim/math.cuh"
#include "prim/types.cuh"

namespace fj::fa2 {

// Writes `Rows` rows (those below `valid_rows`) of `Chunks` chunks from shared memory to global.
template <int Rows, int Chunks, int SmemStride>
__device__ __forceinline__ void store_tile(const u16 *smem, int valid_rows, u16 *global, i64 row_stride) {
#pragma unroll 2
  for (int idx = threadIdx.x; idx < Rows * Chunks; idx += Cfg::kThreads) {
    const int row = idx / Chunks;
    const int chunk = idx % Chunks;
    if (row >= valid_rows)
      continue;
    const u32x4 packed = *(const u32x4 *)(smem + row * SmemStride + chunk * kChunkElems);
    u16 *dst = global + row * row_stride + chunk * kChunkElems;
    if constexpr (Cfg::kAligned16) {
      *(u32x4 *)dst = packed;
    } else {
      const u32 words[] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
      for (int e = 0; e < kChunkElems; ++e)
        dst[e] = (u16)(words[e / 2] >> ((e % 2) * kBf16Shift));
    }
  }
}

// LSE element of query row `row` (natural log), laid out [batch, heads_q, seqlen_q] or, varlen,
// [heads_q, total_q].
__device__ __forceinline__ float *lse_at(const fj_attention_params &p, const Tile &t, int row) {
  if constexpr (Cfg::kVarlen)
    return p.maybe_lse + (i64)t.head * p.total_q + t.q_row0 + row;
  else
    return p.maybe_lse + ((i64)t.batch * p.heads_q + t.head) * p.seqlen_q + row;
}

// A tile whose rows see no key at all: O = 0, LSE = -inf.
__device__ __forceinline__ void write_empty_tile(const fj_attention_params &p, const Tile &t) {
  const int rows = min_i(Cfg::kBlockM, t.seqlen_q - t.m0);
  for (int idx = threadIdx.x; idx < rows * Cfg::kHeadDimV; idx += Cfg::kThreads) {
    const int row = idx / Cfg::kHeadDimV;
    t.o[(i64)(t.m0 + row) * p.o.row_stride + idx % Cfg::kHeadDimV] = 0;
  }
  if (p.maybe_lse != nullptr)
    for (int row = threadIdx.x; row < rows; row += Cfg::kThreads)
      *lse_at(p, t, t.m0 + row) = neg_inf();
}

// Row 0 of this (batch, head) in O, as make_tile computes t.o; the 32-row schedule recomputes it
// after the key loop instead of keeping t.o live through it (make_tile keeps its own copy of the
// formula so that the 16-row kernels compile exactly as before).
__device__ __forceinline__ u16 *output_base(const fj_attention_params &p, const Tile &t) {
  const i64 o_off = Cfg::kVarlen ? t.q_row0 * p.o.row_stride : (i64)t.batch * p.o.batch_stride;
  return (u16 *)p.o.ptr + o_off + (i64)t.head * p.o.head_stride;
}

} // namespace fj::fa2
