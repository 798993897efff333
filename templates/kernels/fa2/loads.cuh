// Generic global -> shared copies of the fa2 prefill kernel: load_tile (a thread-strided loop of
// cp.async, or of predicated element loads for element-aligned rows; paged rows through kv_row), Q's
// load (load_q), K/V blocks of element-aligned layouts (load_kv; 16-byte-aligned ones stream through
// kernels/fa2/kv_stream.cuh), and the zeroed head-dim padding of Q and K.
#pragma once

#include "kernel_params.h"
#include "kernels/fa2/tile.cuh"
#include "kernels/fa2/traits.cuh"
#include "prim/cp_async.cuh"
#include "prim/types.cuh"

namespace fj::fa2 {

// Start of key/value row `row` (relative to the sequence), through the block table when paged.
__device__ __forceinline__ const u16 *kv_row(const fj_attention_params &p, const Tile &t, const u16 *base,
                                             fj_i64 page_stride, fj_i64 row_stride, int row) {
  if constexpr (Cfg::kPageSize > 0) {
    const int page = p.paged.block_table[(i64)t.batch * p.paged.max_pages_per_seq + row / kPageRows];
    return base + (i64)page * page_stride + (i64)(row % kPageRows) * row_stride;
  } else {
    return base + (i64)row * row_stride;
  }
}

// Copies `Rows` rows of `Chunks` 16-byte chunks into shared memory (row stride `SmemStride`
// elements). Rows at or past `valid_rows` land as zeros so that padding never turns into NaN.
// `row_ptr(r)` gives the global start of row r (only called for valid rows).
template <int Rows, int Chunks, int SmemStride, class RowPtr>
__device__ __forceinline__ void load_tile(u16 *smem, int valid_rows, RowPtr row_ptr, const void *any_valid) {
#pragma unroll 2
  for (int idx = threadIdx.x; idx < Rows * Chunks; idx += Cfg::kThreads) {
    const int row = idx / Chunks;
    const int chunk = idx % Chunks;
    u16 *dst = smem + row * SmemStride + chunk * kChunkElems;
    const bool valid = row < valid_rows;
    if constexpr (Cfg::kAligned16) {
      const u16 *src = valid ? row_ptr(row) + chunk * kChunkElems : (const u16 *)any_valid;
      cp_async_cg_16(cvta_to_shared_u32(dst), src, valid ? kCpAsyncBytes : 0);
    } else {
      // Element-aligned rows: eight predicated 16-bit loads, one 16-byte shared store.
      u16 vals[kChunkElems];
      const u16 *src = valid ? row_ptr(row) + chunk * kChunkElems : nullptr;
#pragma unroll
      for (int e = 0; e < kChunkElems; ++e)
        vals[e] = valid ? src[e] : (u16)0;
      u32x4 packed;
      packed.x = (u32)vals[0] | ((u32)vals[1] << kBf16Shift);
      packed.y = (u32)vals[2] | ((u32)vals[3] << kBf16Shift);
      packed.z = (u32)vals[4] | ((u32)vals[5] << kBf16Shift);
      packed.w = (u32)vals[6] | ((u32)vals[7] << kBf16Shift);
      *(u32x4 *)dst = packed;
    }
  }
}

// Query tile -> shared memory (one commit group).
__device__ __forceinline__ void load_q(const fj_attention_params &p, const Tile &t, u16 *smem_q) {
  const u16 *q = t.q + (i64)t.m0 * p.q.row_stride;
  load_tile<Cfg::kBlockM, kChunksQK, Cfg::kSmemStrideQ>(
      smem_q, t.seqlen_q - t.m0, [&](int row) { return q + (i64)row * p.q.row_stride; }, t.q);
  cp_async_commit_group();
}

// Key (IsV = false) or value block `n_block` -> shared buffer; always commits a group, empty when
// the block is past the range, so the group arithmetic stays fixed.
template <bool IsV>
__device__ __forceinline__ void load_kv(const fj_attention_params &p, const Tile &t, u16 *smem, int n_block,
                                        int n_end) {
  if (n_block < n_end) {
    const int n0 = n_block * Cfg::kBlockN;
    const u16 *base = IsV ? t.v : t.k;
    const fj_i64 row_stride = IsV ? p.v.row_stride : p.k.row_stride;
    const fj_i64 page_stride = IsV ? p.paged.page_stride_v : p.paged.page_stride_k;
    auto row_ptr = [&](int row) { return kv_row(p, t, base, page_stride, row_stride, n0 + row); };
    if constexpr (IsV)
      load_tile<Cfg::kBlockN, kChunksV, Cfg::kSmemStrideV>(smem, t.seqlen_k - n0, row_ptr, base);
    else
      load_tile<Cfg::kBlockN, kChunksQK, Cfg::kSmemStrideK>(smem, t.seqlen_k - n0, row_ptr, base);
  }
  cp_async_commit_group();
}

// Zeroes the columns between head_dim_qk and its 16-padding in Q and every K buffer: the MMA
// reads them, and uninitialized shared memory may hold NaN bit patterns.
__device__ __forceinline__ void zero_qk_padding(u16 *smem_q, u16 *smem_k) {
  if constexpr (Cfg::kHeadDimQKPad > Cfg::kHeadDimQK) {
    const u32x4 zero = {0, 0, 0, 0};
    constexpr int kKRows = Cfg::kStages * Cfg::kBlockN;
    for (int row = threadIdx.x; row < Cfg::kBlockM + kKRows; row += Cfg::kThreads) {
      u16 *dst =
          row < Cfg::kBlockM ? smem_q + row * Cfg::kSmemStrideQ : smem_k + (row - Cfg::kBlockM) * Cfg::kSmemStrideK;
      *(u32x4 *)(dst + Cfg::kHeadDimQK) = zero;
    }
  }
}

} // namespace fj::fa2
