// K/V copies of the fa2 prefill kernel for 16-byte-aligned rows: KvStream, a fixed per-thread pattern
// of cp.async copies for contiguous K/V and for paged K/V (through the block table), and stream_kv,
// which issues one K or V block through it (kKvStream: in place of load_tile's loop).
#pragma once

#include "kernel_params.h"
#include "kernels/fa2/tile.cuh"
#include "kernels/fa2/traits.cuh"
#include "prim/address.cuh"
#include "prim/cp_async.cuh"
#include "prim/ld_global.cuh"
#include "prim/types.cuh"

namespace fj::fa2 {

// Contiguous, 16-byte-aligned K/V (not paged) stream through a fixed per-thread pattern: thread t
// copies chunk t % Chunks of rows t / Chunks + i * kRowsPerPass of every block, so its source
// pointer and shared address are computed once per CTA and a block only adds its row offset.
// load_tile's generic loop recomputes 64-bit row addresses and the shared window for every chunk
// (~45 SASS instructions per cp.async at d128, ~360 per K or V block and thread), and the ring
// issues that code right after the per-block barrier, where it delays every warp's first MMA.
// When Chunks does not divide kThreads, the last kThreads % Chunks threads stay idle.
template <int Chunks, int SmemStride> struct KvStream {
  static constexpr int kRowsPerPass = Cfg::kThreads / Chunks;
  static constexpr int kPasses = (Cfg::kBlockN + kRowsPerPass - 1) / kRowsPerPass;
  // Every (thread, pass) pair names a row inside the block: no per-pass bounds check.
  static constexpr bool kEven = Cfg::kThreads % Chunks == 0 && Cfg::kBlockN % kRowsPerPass == 0;
  static constexpr u32 kPassSmemBytes = kRowsPerPass * SmemStride * kElemBytes;
  static_assert(kRowsPerPass >= 1, "one row of chunks fits the CTA");

  // This thread's place in the pattern: its first row, its chunk, and that chunk's shared address
  // in the buffer at `buf`. False for the idle threads.
  struct Lane {
    int row0, chunk;
    u32 to;
  };
  static __device__ __forceinline__ bool lane_of(u32 buf, Lane *lane) {
    const int tid = threadIdx.x;
    lane->row0 = tid / Chunks;
    lane->chunk = tid % Chunks;
    lane->to = buf + (u32)(lane->row0 * SmemStride + lane->chunk * kChunkElems) * kElemBytes;
    return Cfg::kThreads % Chunks == 0 || lane->row0 < kRowsPerPass;
  }

  // Copies the kBlockN rows of block `n_block` of the sequence starting at `seq` into the buffer
  // at shared address `buf`; rows at or past `valid_rows` land as zeros. Full blocks skip the row
  // predicates. The thread's row and chunk come from threadIdx here, and `seq` / `buf` are the
  // same for the whole CTA (uniform registers), so nothing per thread lives across the key loop.
  template <bool Full>
  static __device__ __forceinline__ void copy(const u16 *seq, u32 buf, int n_block, i64 row_stride, int valid_rows,
                                              const u16 *tensor_base) {
    Lane lane;
    if (!lane_of(buf, &lane))
      return; // idle thread
    const auto [row0, chunk, to] = lane;
    const i64 pass_stride = (i64)kRowsPerPass * row_stride;
    const u16 *from = seq + (i64)(n_block * Cfg::kBlockN + row0) * row_stride + chunk * kChunkElems;
    const int limit = valid_rows - row0; // pass i is valid iff i * kRowsPerPass < limit
    // A zero-filled chunk still names a source (src-size 0 reads nothing): the tensor's first
    // element, which always exists and lives in the parameter bank.
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const bool in_block = kEven || row0 + i * kRowsPerPass < Cfg::kBlockN;
      if (in_block) {
        const bool valid = Full || i * kRowsPerPass < limit;
        cp_async_cg_16(to + i * kPassSmemBytes, valid ? from : tensor_base, valid ? kCpAsyncBytes : 0);
      }
      from += pass_stride;
    }
  }

  // Paged K/V, the same pattern: each pass's row through the block table (`pages`, this
  // sequence's entries), its page number an L1 hit for the passes that share a page, its address
  // one multiply-add from `head` (the KV head's start, this thread's chunk) where Stride is i32.
  // Rows at or past `valid_rows` read no table entry and land as zeros.
  template <class Stride>
  static __device__ __forceinline__ void copy_paged(const u8 *head, const i32 *pages, u32 buf, int n_block,
                                                    Stride page_bytes, Stride row_bytes, int valid_rows,
                                                    const u16 *tensor_base) {
    Lane lane;
    if (!lane_of(buf, &lane))
      return; // idle thread
    const auto [row0, chunk, to] = lane;
    const u8 *from = head + chunk * kChunkElems * kElemBytes;
    // Unsigned: the divisions by the page size are a multiply and a shift.
    const u32 key0 = (u32)(n_block * Cfg::kBlockN + row0);
    const int limit = valid_rows - row0;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const bool in_block = kEven || row0 + i * kRowsPerPass < Cfg::kBlockN;
      if (in_block) {
        const bool valid = i * kRowsPerPass < limit;
        const u32 key = key0 + i * kRowsPerPass;
        const void *src = tensor_base;
        if (valid) {
          const i32 page = ld_global_nc_s32(pages + (i32)(key / kPageRows));
          src = advance_to_paged_row<kPageRows>(from, page, key, page_bytes, row_bytes);
        }
        cp_async_cg_16(to + i * kPassSmemBytes, src, valid ? kCpAsyncBytes : 0);
      }
    }
  }
};

// The fixed-pattern copy applies to 16-byte-aligned K/V, contiguous or paged (through the block
// table: load_tile's generic loop took ~48 SASS instructions a paged cp.async at d128, session 30);
// element-aligned layouts keep load_tile.
constexpr bool kKvStream = Cfg::kAligned16;

// Block `n_block` of K (IsV = false) or V through its stream into the buffer at shared address
// `buf`; always commits a group, empty when the block is past the range.
template <bool IsV>
__device__ __forceinline__ void stream_kv(const fj_attention_params &p, const Tile &t, u32 buf, int n_block,
                                          int n_end) {
  using Stream = KvStream<IsV ? kChunksV : kChunksQK, IsV ? Cfg::kSmemStrideV : Cfg::kSmemStrideK>;
  if (n_block < n_end && Cfg::kPageSize > 0) {
    const fj_tensor_ref &kv = IsV ? p.v : p.k;
    const u16 *tensor_base = (const u16 *)kv.ptr;
    const u8 *head = (const u8 *)kv.ptr + (i64)t.head_kv * kv.head_stride * kElemBytes;
    const i32 *pages = p.paged.block_table + (i64)t.batch * p.paged.max_pages_per_seq;
    const i64 page_bytes = (IsV ? p.paged.page_stride_v : p.paged.page_stride_k) * kElemBytes;
    const i64 row_bytes = kv.row_stride * kElemBytes;
    const int valid_rows = t.seqlen_k - n_block * Cfg::kBlockN;
    if (fits_i32(page_bytes) && fits_i32(row_bytes))
      Stream::copy_paged(head, pages, buf, n_block, (i32)page_bytes, (i32)row_bytes, valid_rows, tensor_base);
    else
      Stream::copy_paged(head, pages, buf, n_block, page_bytes, row_bytes, valid_rows, tensor_base);
  } else if (n_block < n_end) {
    const fj_i64 row_stride = IsV ? p.v.row_stride : p.k.row_stride;
    const u16 *tensor_base = (const u16 *)(IsV ? p.v.ptr : p.k.ptr);
    // Recomputed from the parameter bank and the tile's indices (uniform registers) rather than
    // t.k / t.v, which would occupy two vector registers each across the key loop.
    const fj_tensor_ref &kv = IsV ? p.v : p.k;
    const i64 seq_off = Cfg::kVarlen ? t.k_row0 * kv.row_stride : (i64)t.batch * kv.batch_stride;
    const u16 *seq = (const u16 *)kv.ptr + seq_off + (i64)t.head_kv * kv.head_stride;
    const int valid_rows = t.seqlen_k - n_block * Cfg::kBlockN;
    if (valid_rows >= Cfg::kBlockN)
      Stream::template copy<true>(seq, buf, n_block, row_stride, valid_rows, tensor_base);
    else
      Stream::template copy<false>(seq, buf, n_block, row_stride, valid_rows, tensor_base);
  }
  cp_async_commit_group();
}

} // namespace fj::fa2
