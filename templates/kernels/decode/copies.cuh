// Global -> shared copies of the split-K decode kernel: 16-byte chunks (cp.async, or synchronous
// loads for element-aligned rows), TileCopy (one K or V tile, copied by every thread), KvSource (a
// piece's K/V addressing and the issue of its tiles: contiguous, paged through the row-address
// ring, or TMA tiles), and Q's load with the zero padding of its last QK k step.
#pragma once

#include "kernel_params.h"
#include "kernels/decode/smem.cuh"
#include "kernels/decode/traits.cuh"
#include "kernels/decode/work.cuh"
#include "prim/cp_async.cuh"
#include "prim/cp_async_l2.cuh"
#include "prim/ld_global.cuh"
#include "prim/mbarrier.cuh"
#include "prim/tma.cuh"
#include "prim/types.cuh"

namespace fj::decode {

// ---- global -> shared copies ---------------------------------------------------------------------

// One 16-byte chunk of 16-bit elements. The aligned path is asynchronous and zero-fills a chunk
// past the end; the element-aligned path loads synchronously.
__device__ __forceinline__ void copy_chunk(u16 *dst, const u16 *src, bool valid) {
  if constexpr (Cfg::kAligned16) {
    cp_async_cg_16(cvta_to_shared_u32(dst), src, valid ? kCpAsyncBytes : 0);
  } else {
#pragma unroll
    for (int i = 0; i < kChunkElems; ++i)
      dst[i] = valid ? ld_global_nc_u16(src + i) : (u16)0;
  }
}

// One 16-byte chunk of the K/V stream into shared address `dst` (16-byte aligned rows only): an
// asynchronous copy that zero-fills past the end, with the L2 policy `policy` and a 128-byte L2
// prefetch when the plan asks for them (kKvL2Hints).
__device__ __forceinline__ void copy_kv_chunk_async(u32 dst, const u16 *src, bool valid, u64 policy) {
  if constexpr (Cfg::kKvL2Hints != 0)
    cp_async_cg_16_l2_hint_128b(dst, src, valid ? kCpAsyncBytes : 0, policy);
  else
    cp_async_cg_16(dst, src, valid ? kCpAsyncBytes : 0);
}

// Copies of one K or V tile.
// 16-byte aligned rows: thread t keeps column t % kChunksPerRow of the tile and copies rows
// t / kChunksPerRow + i * kRowsPerPass, so a tile costs one source address per thread, a 64-bit add
// per copy and shared offsets that are immediates (session 12: the per-copy multiply, 64-bit shared
// address and select had made the copies ~10 integer instructions each; +1.2..2.8% contiguous).
// Threads past kRowsPerPass * kChunksPerRow (head dims whose rows do not divide the CTA) copy nothing.
// Element-aligned rows: copy_synchronously.
template <int Dim, int SmemRow> struct TileCopy {
  static constexpr int kChunksPerRow = Dim / kChunkElems;
  static constexpr int kRowsPerPass = Cfg::kThreads / kChunksPerRow;
  static constexpr int kPasses = (Cfg::kBlockN + kRowsPerPass - 1) / kRowsPerPass;
  static constexpr u32 kPassBytes = kRowsPerPass * SmemRow * kElemBytes;
  static_assert(kRowsPerPass >= 1, "a row's chunks fit the CTA's threads");
  // Element-aligned path: chunks, and how far its loop unrolls. Fully unrolled, ptxas keeps every
  // iteration's loaded elements and address live; 4 there (d128 g4 on sm_90a spilled 96 bytes at 8).
  static constexpr int kChunks = Cfg::kBlockN * kChunksPerRow;
  static constexpr int kIters = (kChunks + Cfg::kThreads - 1) / Cfg::kThreads;
  static constexpr int kMaxUnroll = 4;
  static constexpr int kUnroll = kIters < kMaxUnroll ? kIters : kMaxUnroll;
  // Paged: row addresses read from the ring per batch, two registers each (at head dim 256, 16
  // passes, reading all at once would hold 32).
  static constexpr int kMaxAddressBatch = 8;
  static constexpr int kAddressBatch = kPasses < kMaxAddressBatch ? kPasses : kMaxAddressBatch;

  // This thread's first row and column (row >= kRowsPerPass: no copies).
  __device__ static int first_row() { return (int)threadIdx.x / kChunksPerRow; }
  __device__ static int column() { return ((int)threadIdx.x % kChunksPerRow) * kChunkElems; }
  // Row `row` of pass `pass` is in the tile: always but in a last pass that runs past kBlockN
  // (head dims whose rows per pass do not divide the tile).
  __device__ static bool row_exists(int row, int pass) {
    return (pass + 1) * kRowsPerPass <= Cfg::kBlockN || row < Cfg::kBlockN;
  }

  // Contiguous rows `row_stride` elements apart, from `base`.
  __device__ static void issue(u16 *smem, const u16 *base, int rows_valid, i64 row_stride, u64 policy) {
    if constexpr (Cfg::kAligned16) {
      const int row0 = first_row();
      if (row0 >= kRowsPerPass)
        return;
      const u32 dst = cvta_to_shared_u32(smem + row0 * SmemRow + column());
      const u16 *src = base + row0 * row_stride + column();
      const i64 pass_stride = kRowsPerPass * row_stride;
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int row = row0 + pass * kRowsPerPass;
        if (!row_exists(row, pass))
          break;
        const bool valid = row < rows_valid;
        copy_kv_chunk_async(dst + pass * kPassBytes, valid ? src : base, valid, policy);
        src += pass_stride;
      }
    } else {
      copy_synchronously(smem, rows_valid, [&](int row) { return base + row * row_stride; });
    }
  }

  // Paged: the address of every row comes from the smem ring `rows` (rows past the end hold a valid
  // base). A batch reads all of its addresses before its first copy: the copies' asm clobbers
  // memory, so a read after one copy could not move above it and every copy would wait out a
  // shared-memory round trip (measured in SASS: one LDS -> IMAD chain per 16-byte copy).
  __device__ static void issue_rows(u16 *smem, const u16 *const *rows, int rows_valid, u64 policy) {
    if constexpr (Cfg::kAligned16) {
      const int row0 = first_row();
      if (row0 >= kRowsPerPass)
        return;
      const u32 dst = cvta_to_shared_u32(smem + row0 * SmemRow + column());
      for (int batch = 0; batch < kPasses; batch += kAddressBatch) {
        const u16 *src[kAddressBatch];
#pragma unroll
        for (int i = 0; i < kAddressBatch; ++i) {
          const int row = row0 + (batch + i) * kRowsPerPass;
          // In bounds for a partial last pass; whole passes fold the choice away at compile time.
          src[i] = rows[row_exists(row, batch + i) ? row : Cfg::kBlockN - 1];
        }
#pragma unroll
        for (int i = 0; i < kAddressBatch; ++i) {
          const int pass = batch + i;
          const int row = row0 + pass * kRowsPerPass;
          if ((kPasses % kAddressBatch != 0 && pass >= kPasses) || !row_exists(row, pass))
            break;
          copy_kv_chunk_async(dst + pass * kPassBytes, src[i] + column(), row < rows_valid, policy);
        }
      }
    } else {
      copy_synchronously(smem, rows_valid, [&](int row) { return rows[row]; });
    }
  }

  // Element-aligned rows: chunk c = it * kThreads + tid of row c / kChunksPerRow, whose global
  // address is row_address(row); rows at or past rows_valid are zeros and read nothing.
  template <class RowAddress>
  __device__ static void copy_synchronously(u16 *smem, int rows_valid, const RowAddress &row_address) {
#pragma unroll kUnroll
    for (int it = 0; it < kIters; ++it) {
      const int c = it * Cfg::kThreads + (int)threadIdx.x;
      if (kChunks % Cfg::kThreads != 0 && c >= kChunks)
        break;
      const int row = c / kChunksPerRow;
      const int col = (c % kChunksPerRow) * kChunkElems;
      copy_chunk(smem + row * SmemRow + col, row_address(row) + col, row < rows_valid);
    }
  }
};

using KCopy = TileCopy<Cfg::kHeadDimQK, Cfg::kSmemRowQK>;
using VCopy = TileCopy<Cfg::kHeadDimV, Cfg::kSmemRowV>;

// Per-piece addressing of K and V. Paged KV: the global address of every K and V row of a tile sits
// in a small smem ring (`row_addrs`, one slot per stage). Thread r < kBlockN looks up the page of
// row r of the tile one step ahead of when it stores the row's addresses and two steps ahead of
// its copies, so a block-table read never stalls the ring; the loop's barrier orders the store
// before the copies that read it. A piece may start and end at any key (the schedule balances CTAs
// by keys): tiles count from kv_begin, every row finds its own page and offset in the page, and
// rows at or past kv_end are zero-filled and masked.
struct KvSource {
  const u16 *k, *v;
  i64 k_row, v_row, k_page, v_page;
  const i32 *table; // this sequence's block-table row
  int kv_begin, kv_end;
  u64 policy;                // L2 policy of the copies (kKvL2Hints)
  const fj_tensor_map *maps; // TMA tiles: K's map, then V's
  int batch, head_kv;

  __device__ int tile_key(int tile) const { return kv_begin + tile * Cfg::kBlockN; }

  // Page of row `threadIdx.x` of `tile` (0 past the end, or for threads past the tile).
  __device__ i32 lookup(int tile) const {
    if constexpr (Traits::kPaged) {
      const int key = tile_key(tile) + (int)threadIdx.x;
      if ((int)threadIdx.x < Cfg::kBlockN && key < kv_end)
        return ld_global_nc_s32(table + key / Cfg::kPageSize);
    }
    return 0;
  }
  // Row `threadIdx.x` of `tile`: its K and V addresses (the head's row of `page`) into the ring.
  // One 64-bit multiply per row and tile here instead of one per 16-byte copy.
  __device__ void store_row_addrs(const Smem &smem, int tile, i32 page) const {
    if constexpr (Traits::kPaged)
      if ((int)threadIdx.x < Cfg::kBlockN) {
        const int key = tile_key(tile) + (int)threadIdx.x;
        const bool valid = key < kv_end;
        const i64 in_page = key % Cfg::kPageSize;
        const u16 **rows = smem.row_addrs(tile % Cfg::kStages);
        rows[threadIdx.x] = valid ? k + page * k_page + in_page * k_row : k;
        rows[Cfg::kBlockN + threadIdx.x] = valid ? v + page * v_page + in_page * v_row : v;
      }
  }

  // TMA tiles, paged: the page of row group threadIdx.x of `tile` (threads past the groups or the
  // piece: 0, unused).
  __device__ i32 group_page(int tile) const {
    if constexpr (kTmaKv && Traits::kPaged) {
      const int key = tile_key(tile) + (int)threadIdx.x * TmaTile::kBoxRows;
      if ((int)threadIdx.x < TmaTile::kGroups && key < kv_end)
        return ld_global_nc_s32(table + key / Cfg::kPageSize);
    }
    return 0;
  }

  __device__ void issue(const Smem &smem, int tile, i32 group_page = 0) const {
    const int key0 = tile_key(tile);
    const int rows_valid = kv_end - key0;
    const int stage = tile % Cfg::kStages;
    if constexpr (kTmaKv) {
      // Thread g < kGroups loads row group g (paged: the page `group_page` came from group_page()).
      const int group = (int)threadIdx.x;
      const int groups_valid = min(TmaTile::kGroups, (rows_valid + TmaTile::kBoxRows - 1) / TmaTile::kBoxRows);
      const u32 bar = smem.full_bar(stage);
      if (group == 0) {
        if (Traits::kPaged && key0 % TmaTile::kBoxRows != 0)
          __trap(); // the schedule must cut pieces on whole boxes
        mbarrier_arrive_expect_tx(bar, groups_valid * TmaTile::kGroupTxBytes);
      }
      if (group < groups_valid) {
        const int key = key0 + group * TmaTile::kBoxRows;
        const int row_coord = Traits::kPaged ? key % Cfg::kPageSize : key;
        const int outer_coord = Traits::kPaged ? group_page : batch;
        const u32 offset = group * TmaTile::kBoxRows * TmaTile::kSwizzleBytes;
        const u32 k_dst = cvta_to_shared_u32(smem.k(stage)) + offset,
                  v_dst = cvta_to_shared_u32(smem.v(stage)) + offset;
        for (int panel = 0; panel < TmaTile::kPanelsQK; ++panel)
          tma_load_4d(k_dst + panel * TmaTile::kPanelBytes, maps, bar, panel * TmaTile::kPanelCols, head_kv, row_coord,
                      outer_coord, policy);
        for (int panel = 0; panel < TmaTile::kPanelsV; ++panel)
          tma_load_4d(v_dst + panel * TmaTile::kPanelBytes, maps + 1, bar, panel * TmaTile::kPanelCols, head_kv,
                      row_coord, outer_coord, policy);
      }
    } else if constexpr (Traits::kPaged) {
      const u16 *const *rows = smem.row_addrs(stage);
      KCopy::issue_rows(smem.k(stage), rows, rows_valid, policy);
      VCopy::issue_rows(smem.v(stage), rows + Cfg::kBlockN, rows_valid, policy);
    } else {
      KCopy::issue(smem.k(stage), k + key0 * k_row, rows_valid, k_row, policy);
      VCopy::issue(smem.v(stage), v + key0 * v_row, rows_valid, v_row, policy);
    }
  }
};

__device__ __forceinline__ KvSource kv_source(const fj_attention_params &a, const Unit &u) {
  KvSource s;
  const i64 k_head = (i64)u.head_kv * a.k.head_stride;
  const i64 v_head = (i64)u.head_kv * a.v.head_stride;
  const i64 k_batch = Traits::kPaged ? 0 : (i64)u.batch * a.k.batch_stride;
  const i64 v_batch = Traits::kPaged ? 0 : (i64)u.batch * a.v.batch_stride;
  s.k = static_cast<const u16 *>(a.k.ptr) + k_batch + k_head;
  s.v = static_cast<const u16 *>(a.v.ptr) + v_batch + v_head;
  s.k_row = a.k.row_stride;
  s.v_row = a.v.row_stride;
  s.k_page = a.paged.page_stride_k;
  s.v_page = a.paged.page_stride_v;
  s.table = Traits::kPaged ? a.paged.block_table + (i64)u.batch * a.paged.max_pages_per_seq : nullptr;
  s.kv_begin = u.kv_begin;
  s.kv_end = u.kv_end;
  s.policy = 0;
  s.maps = nullptr;
  s.batch = u.batch;
  s.head_kv = u.head_kv;
  if constexpr (Cfg::kKvL2Hints != 0)
    s.policy = l2_policy_evict_first();
  return s;
}

// Q rows of the unit into shared memory; rows past the real ones are zero (they never reach HBM).
__device__ __forceinline__ void load_q(const fj_attention_params &a, const Unit &u, const Smem &smem) {
  constexpr int kChunks = Cfg::kBlockM * Traits::kChunksQK;
  for (int c = (int)threadIdx.x; c < kChunks; c += Cfg::kThreads) {
    const int r = c / Traits::kChunksQK;
    const int col = (c % Traits::kChunksQK) * kChunkElems;
    const int row = u.m_block * Cfg::kBlockM + r;
    const bool valid = r < u.rows_here;
    const u16 *src = static_cast<const u16 *>(a.q.ptr);
    if (valid) {
      const int token = row / Cfg::kGqaGroup;
      const int head = u.head_kv * Cfg::kGqaGroup + row % Cfg::kGqaGroup;
      src += (i64)u.batch * a.q.batch_stride + (i64)token * a.q.row_stride + (i64)head * a.q.head_stride + col;
    }
    copy_chunk(smem.q() + r * Cfg::kSmemRowQK + col, src, valid);
  }
}

// Columns [kHeadDimQK, kHeadDimQKMma) of Q and of every K stage are the zero padding of the last
// QK k step (head dims that are 8 mod 16). No copy ever writes them, so zeroing once suffices.
__device__ __forceinline__ void zero_qk_padding(const Smem &smem) {
  constexpr int kPad = Cfg::kHeadDimQKMma - Cfg::kHeadDimQK;
  if constexpr (kPad > 0) {
    for (int r = (int)threadIdx.x; r < Cfg::kBlockM; r += Cfg::kThreads)
      for (int c = 0; c < kPad; ++c)
        smem.q()[r * Cfg::kSmemRowQK + Cfg::kHeadDimQK + c] = 0;
    for (int r = (int)threadIdx.x; r < Cfg::kStages * Cfg::kBlockN; r += Cfg::kThreads)
      for (int c = 0; c < kPad; ++c)
        smem.k(r / Cfg::kBlockN)[(r % Cfg::kBlockN) * Cfg::kSmemRowQK + Cfg::kHeadDimQK + c] = 0;
  }
}

} // namespace fj::decode
