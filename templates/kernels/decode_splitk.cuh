// FlashDecoding: split-K attention for short queries (q_len 1..16) over a long, optionally paged,
// KV cache. Entries: `fj_decode_splitk` (the keys) and `fj_decode_combine` (merge of split units).
//
// Work: one unit is (sequence, kv head, m block). The query heads that share the kv head are packed
// into the M dimension (row = token * group + head_in_group), so every KV byte is read once per
// unit. The host schedule (compiler/splitk_schedule) cuts the units' keys into pieces and gives each
// CTA of the fixed grid a balanced, contiguous run of pieces. A piece that is a whole unit writes O
// directly; the pieces of a split unit write (O, LSE) partial states. With kFusedMerge the CTA that
// writes a unit's last outstanding state merges them in the same grid (an arrival counter per split
// unit; see arrive_and_maybe_merge), so a step is one launch; without it fj_decode_combine merges
// them in a second launch. Both run merge_unit: the same arithmetic in the same order.
//
// Inside a CTA: a kStages-deep ring of kBlockN-key tiles (K and V), loaded by TMA (kTmaKv, sm_90:
// one mbarrier per stage) or by every thread's cp.async copies. The warps split each
// tile's keys (kWarpN each), run an online softmax over their own keys with mma.sync m16n8k16, and
// are merged through shared memory at the end of the piece (Q's A fragments, at head dims up to 128,
// stay in registers for the whole piece: kHoldQ). Decode is bound by KV bandwidth, so the
// design is about bytes in flight: the plan sizes stages x CTAs per SM for that. With kKvL2Hints
// (sm_90) the K/V copies carry an L2 evict-first policy (the stream is read once; the work list,
// tables and partial states stay in L2 across launches) and a 128-byte L2 prefetch.
//
// Launch (sm_90): the runtime launches fj_decode_splitk with programmatic stream serialization
// (PDL) (and the combine, when the merge is not fused). The decode reads only the host-written work
// list before griddepcontrol.wait, so its launch and work-list latency overlap the previous kernel
// of the stream (the previous step's combine or, fused, the previous step's decode; both let it in
// early with griddepcontrol.launch_dependents).
#pragma once

#include "kernels/combine.cuh"
#include "params_decode.h"
#include "prim/atomic.cuh"
#include "prim/cp_async.cuh"
#include "prim/cp_async_l2.cuh"
#include "prim/fence.cuh"
#include "prim/griddep.cuh"
#include "prim/ld_global.cuh"
#include "prim/ldmatrix.cuh"
#include "prim/math.cuh"
#include "prim/mbarrier.cuh"
#include "prim/mma.cuh"
#include "prim/st_global.cuh"
#include "prim/timer.cuh"
#include "prim/tma.cuh"
#include "prim/types.cuh"
#include "prim/warp.cuh"

// Diagnostic builds only (FJ_DECODE_TIMELINE defined before this header; bench/harness/decode):
// thread 0 of every CTA writes %globaltimer at fixed points of its run into
// fj_decode_timeline[step % kTimelineSteps][blockIdx.x], `step` from fj_decode_params.pad_.
// The points of a CTA's run a timeline build records, in the order of its slots.
enum fj_decode_timeline_event {
  fj_mark_entry,       // kernel entry
  fj_mark_waited,      // after griddepcontrol.wait
  fj_mark_first_tile,  // the CTA's first tile landed
  fj_mark_loop_end,    // a piece's key loop done
  fj_mark_stored,      // a piece's partial state (or O) stored
  fj_mark_merge_start, // this CTA merges a split unit (fused merge)
  fj_mark_exit,        // all pieces done
  fj_mark_sm_pieces,   // %smid | pieces << 32 (not a time)
};
#ifdef FJ_DECODE_TIMELINE
enum { fj_decode_timeline_steps = 8, fj_decode_timeline_ctas = 1024, fj_decode_timeline_events = 8 };
extern "C" {
__device__ unsigned long long fj_decode_timeline[fj_decode_timeline_steps][fj_decode_timeline_ctas]
                                                [fj_decode_timeline_events];
}
#define FJ_DECODE_MARK(params, event, value)                                                                           \
  do {                                                                                                                 \
    if (threadIdx.x == 0 && blockIdx.x < fj_decode_timeline_ctas)                                                      \
      fj_decode_timeline[(unsigned)(params).pad_ % fj_decode_timeline_steps][blockIdx.x][event] = (value);             \
  } while (0)
#else
#define FJ_DECODE_MARK(params, event, value)                                                                           \
  do {                                                                                                                 \
  } while (0)
#endif

namespace fj::decode {

using Cfg = KernelConfig;

// Shape of mma.sync m16n8k16 and of one 16-byte copy of 16-bit elements.
constexpr int kMmaM = 16;
constexpr int kMmaN = 8;
constexpr int kMmaK = 16;
constexpr int kElemBytes = 2;
constexpr int kChunkElems = 16 / kElemBytes;
// Rows of a C fragment a thread owns per m tile: g and g + 8.
constexpr int kRowsPerThreadTile = 2;
constexpr int kHalfTile = 8;

struct Traits {
  static constexpr int kWarps = Cfg::kThreads / kWarpSize;
  static constexpr int kMTiles = Cfg::kBlockM / kMmaM;
  static constexpr int kNTilesS = Cfg::kWarpN / kMmaN;  // S columns (keys) per warp, in n8 tiles
  static constexpr int kKStepsPV = Cfg::kWarpN / kMmaK; // P.V k steps per warp
  static constexpr int kKStepsQK = Cfg::kHeadDimQKMma / kMmaK;
  static constexpr int kNTilesO = Cfg::kHeadDimV / kMmaN; // O columns in n8 tiles
  static constexpr int kChunksQK = Cfg::kHeadDimQK / kChunkElems;
  static constexpr int kChunksV = Cfg::kHeadDimV / kChunkElems;
  static constexpr int kRows = Cfg::kGqaGroup * Cfg::kQLen; // packed query rows of a unit
  static constexpr bool kPaged = Cfg::kPageSize > 0;
  static constexpr int kRowAddrsPerStage = 2 * Cfg::kBlockN; // paged: a K and a V address per tile row

  static_assert(Cfg::kThreads % kWarpSize == 0, "whole warps");
  static_assert(Cfg::kBlockM % kMmaM == 0 && Cfg::kBlockM == Cfg::kMTiles * kMmaM, "block_m");
  static_assert(Cfg::kBlockN == Cfg::kWarpN * kWarps, "each warp owns kWarpN keys of a tile");
  static_assert(Cfg::kWarpN % kMmaK == 0, "a warp's keys are whole P.V k steps");
  static_assert(Cfg::kHeadDimQK % kChunkElems == 0 && Cfg::kHeadDimV % kChunkElems == 0, "dims % 8");
  static_assert(Cfg::kHeadDimQKMma % kMmaK == 0 && Cfg::kHeadDimQKMma >= Cfg::kHeadDimQK, "qk pad");
  static_assert(Cfg::kSmemRowQK >= Cfg::kHeadDimQKMma && Cfg::kSmemRowV >= Cfg::kHeadDimV, "smem rows");
  static_assert(Cfg::kMBlocks * Cfg::kBlockM >= kRows, "m blocks cover the packed rows");
  static_assert(Cfg::kStages >= 2, "a ring needs two stages");
  static_assert(Cfg::kSmemOffsetKV + Cfg::kStages * Cfg::kSmemStageBytes <= Cfg::kSmemOffsetStats, "ring fits");
  static_assert(Cfg::kSmemOffsetKV + kWarps * Cfg::kBlockM * Cfg::kMergeRowFloats * (int)sizeof(float) <=
                    Cfg::kSmemOffsetStats,
                "the merge scratch fits in the ring it aliases");
  static_assert(Cfg::kSmemOffsetStats + kWarps * Cfg::kBlockM * 2 * (int)sizeof(float) <= Cfg::kSmemOffsetPages,
                "stats fit");
  static_assert(!kPaged || Cfg::kTmaKv ||
                    Cfg::kSmemOffsetPages + Cfg::kStages * kRowAddrsPerStage * (int)sizeof(void *) <= Cfg::kSmemBytes,
                "row addresses fit");
};

// TMA tiles (plan constant kTmaKv): K/V tiles land by TMA, 64-column boxes with the 128-byte
// swizzle (a whole tile over contiguous KV, kTmaBoxRows keys of one page over pages), credited to one
// mbarrier per stage, instead of 16-byte cp.async copies by every thread. The tensor maps follow
// the parameter block (fj_decode_tma_params). Measured in docs/perf-notes.md (decode, runs 21-21e).
constexpr bool kTmaKv = Cfg::kTmaKv;

struct TmaTile {
  static constexpr int kSwizzleBytes = 128; // one swizzled panel row
  static constexpr int kSwizzleRows = 8;    // the XOR pattern's period, in rows
  static constexpr int kChunkBytes = 16;    // the unit the pattern permutes
  static constexpr int kPanelCols = kSwizzleBytes / kElemBytes;
  static constexpr int kPanelBytes = Cfg::kBlockN * kSwizzleBytes;
  static constexpr int kPanelsQK = Cfg::kHeadDimQK / kPanelCols;
  static constexpr int kPanelsV = Cfg::kHeadDimV / kPanelCols;
  static constexpr int kAtomBytes = kSwizzleRows * kSwizzleBytes; // swizzled boxes start on one
  // Paged KV: a box is kTmaBoxRows keys of one page (pieces start on multiples of it, and page sizes
  // are multiples of it), so a tile is kGroups boxes per panel; contiguous: one box of kBlockN.
  static constexpr int kBoxRows = Cfg::kTmaBoxRows;
  static constexpr int kGroups = Cfg::kBlockN / kBoxRows;
  static constexpr int kMbarrierBytes = 8;
  static constexpr u32 kGroupTxBytes = (kPanelsQK + kPanelsV) * kBoxRows * kSwizzleBytes; // K and V of a group

  static_assert(!kTmaKv || Cfg::kAligned16, "TMA tiles: 16-byte aligned rows");
  static_assert(!kTmaKv || Cfg::kBlockN % kBoxRows == 0, "TMA tiles: a tile is whole boxes");
  static_assert(!kTmaKv || Traits::kPaged || kBoxRows == Cfg::kBlockN, "TMA tiles: one box per contiguous tile");
  static_assert(!kTmaKv || !Traits::kPaged || (Cfg::kPageSize % kBoxRows == 0 && kGroups <= kWarpSize),
                "TMA tiles: page sizes of whole boxes");
  static_assert(!kTmaKv || (Cfg::kHeadDimQK % kPanelCols == 0 && Cfg::kHeadDimV % kPanelCols == 0 &&
                            Cfg::kHeadDimQKMma == Cfg::kHeadDimQK),
                "TMA tiles: head dims of whole 64-column panels");
  static_assert(!kTmaKv || (Cfg::kSmemOffsetKV % kAtomBytes == 0 && Cfg::kSmemStageBytes % kAtomBytes == 0 &&
                            Cfg::kSmemOffsetVInStage % kAtomBytes == 0),
                "TMA tiles: stages on the swizzle atom");
  static_assert(!kTmaKv || (kPanelsQK * kPanelBytes <= Cfg::kSmemOffsetVInStage &&
                            kPanelsV * kPanelBytes <= Cfg::kSmemStageBytes - Cfg::kSmemOffsetVInStage),
                "TMA tiles fit the stage");
  static_assert(!kTmaKv || Cfg::kSmemOffsetPages + Cfg::kStages * kMbarrierBytes + kAtomBytes <= Cfg::kSmemBytes,
                "TMA tiles: the stage barriers and the base's rounding fit");

  // Byte offset of (row, col) in a tile of kBlockN-row panels: chunk c of row r sits at c ^ (r % 8).
  __device__ static u32 offset(int row, int col) {
    const int panel = col / kPanelCols;
    const int chunk = (col % kPanelCols) / kChunkElems;
    return (u32)(panel * kPanelBytes + row * kSwizzleBytes + (chunk ^ (row % kSwizzleRows)) * kChunkBytes);
  }
};

// ---- shared memory -------------------------------------------------------------------------------

struct Smem {
  char *base;
  __device__ u16 *q() const { return reinterpret_cast<u16 *>(base + Cfg::kSmemOffsetQ); }
  __device__ u16 *k(int stage) const {
    return reinterpret_cast<u16 *>(base + Cfg::kSmemOffsetKV + stage * Cfg::kSmemStageBytes);
  }
  __device__ u16 *v(int stage) const {
    return reinterpret_cast<u16 *>(base + Cfg::kSmemOffsetKV + stage * Cfg::kSmemStageBytes + Cfg::kSmemOffsetVInStage);
  }
  // Paged KV: global address of every K row of the tile in `stage`, then of every V row.
  __device__ const u16 **row_addrs(int stage) const {
    return reinterpret_cast<const u16 **>(base + Cfg::kSmemOffsetPages) + stage * Traits::kRowAddrsPerStage;
  }
  // TMA tiles: the full barrier of `stage`, where cp.async tiles keep their paged row addresses.
  __device__ u32 full_bar(int stage) const {
    return cvta_to_shared_u32(base + Cfg::kSmemOffsetPages) + stage * TmaTile::kMbarrierBytes;
  }
  // Per-warp (max, sum) of every row, for the cross-warp merge.
  __device__ float *stats() const { return reinterpret_cast<float *>(base + Cfg::kSmemOffsetStats); }
  // Per-warp unnormalized O rows; aliases the KV ring, which is idle once a piece is done.
  __device__ float *merge() const { return reinterpret_cast<float *>(base + Cfg::kSmemOffsetKV); }
};

// ---- one unit of work, decoded -------------------------------------------------------------------

struct Unit {
  int batch, head_kv, m_block;
  int kv_begin, kv_end, state;
  int kv_len;    // keys of the sequence (causal / window are relative to its end)
  int rows_here; // packed query rows of this m block that exist
};

// The unit of `w` without its KV length (the merge needs none; the length is a load).
__device__ __forceinline__ Unit decode_unit_rows(const fj_decode_params &p, const fj_decode_work &w) {
  Unit u;
  u.m_block = w.unit % p.m_blocks;
  const int pair = w.unit / p.m_blocks;
  u.head_kv = pair % p.attn.heads_kv;
  u.batch = pair / p.attn.heads_kv;
  u.kv_begin = w.kv_begin;
  u.kv_end = w.kv_end;
  u.state = w.state;
  u.kv_len = 0;
  const int rows = Cfg::kGqaGroup * p.attn.seqlen_q;
  const int first = u.m_block * Cfg::kBlockM;
  u.rows_here = rows - first < Cfg::kBlockM ? rows - first : Cfg::kBlockM;
  return u;
}

__device__ __forceinline__ Unit decode_unit(const fj_decode_params &p, const fj_decode_work &w) {
  Unit u = decode_unit_rows(p, w);
  u.kv_len = p.attn.maybe_seqlens_k != nullptr ? ld_global_nc_s32(p.attn.maybe_seqlens_k + u.batch) : p.attn.seqlen_k;
  return u;
}

__device__ __forceinline__ fj_decode_work load_work(const fj_decode_work *work) {
  i32 raw[4];
  ld_global_nc_v4_s32(raw, work);
  return {raw[0], raw[1], raw[2], raw[3]};
}

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

// ---- end of a piece: merge the warps, write O (or a partial state) and LSE -----------------------

constexpr int kStatsPerRow = 2; // (max, sum)

__device__ __forceinline__ fj_decode_merge load_merge(const fj_decode_merge *merge) {
  i32 raw[4]; // {unit, first_state, count, pad}: one 16-byte load
  ld_global_nc_v4_s32(raw, merge);
  return {raw[0], raw[1], raw[2], raw[3]};
}

// The output row of packed row `row` of unit `u`: O and (null without LSE) its LSE.
__device__ __forceinline__ u16 *merge_out_row(const fj_attention_params &a, const Unit &u, int row, float **lse) {
  const int packed = u.m_block * Cfg::kBlockM + row;
  const int token = packed / Cfg::kGqaGroup;
  const int head = u.head_kv * Cfg::kGqaGroup + packed % Cfg::kGqaGroup;
  *lse = a.maybe_lse == nullptr ? nullptr : a.maybe_lse + ((i64)u.batch * a.heads_q + head) * a.seqlen_q + token;
  return static_cast<u16 *>(const_cast<void *>(a.o.ptr)) + (i64)u.batch * a.o.batch_stride +
         (i64)token * a.o.row_stride + (i64)head * a.o.head_stride;
}

// Merges the partial states of one split unit into O (and LSE): warp w of `Warps` takes packed
// rows w, w + Warps, ... `Coherent`: the states were written by other CTAs of this grid (fused).
template <int Warps, bool Coherent>
__device__ __forceinline__ void merge_unit(const fj_decode_params &p, const fj_decode_merge &merge) {
  const fj_attention_params &a = p.attn;
  const fj_decode_work as_work{merge.unit, 0, 0, 0};
  const Unit u = decode_unit_rows(p, as_work);
  constexpr i64 kStateO = (i64)Cfg::kBlockM * Cfg::kHeadDimV;
  for (int row = warp_id(); row < u.rows_here; row += Warps) {
    float *lse;
    u16 *dst = merge_out_row(a, u, row, &lse);
#ifdef FJ_DECODE_MERGE_ONE_PASS // diagnostic builds only (bench/harness/decode gen's ONEPASS=1)
    merge_states_row_one_pass<Cfg::kDType, Cfg::kHeadDimV, Cfg::kAligned16, Coherent>(
#else
    merge_states_row<Cfg::kDType, Cfg::kHeadDimV, Cfg::kAligned16, Coherent>(
#endif
        a.maybe_partial_o + merge.first_state * kStateO + (i64)row * Cfg::kHeadDimV, kStateO,
        a.maybe_partial_lse + (i64)merge.first_state * Cfg::kBlockM + row, Cfg::kBlockM, merge.count, dst, lse);
  }
}

// The fused merge's arrays after merges[grid] (params_decode.h; compiler/splitk_schedule.cpp).
__device__ __forceinline__ const i32 *state_merge_array(const fj_decode_params &p) {
  return reinterpret_cast<const i32 *>(p.merges + gridDim.x);
}
__device__ __forceinline__ i32 *merge_counter_array(const fj_decode_params &p) {
  constexpr int kRound = fj_decode_i32_per_16_bytes;
  const int states = fj_decode_states_per_cta * (int)gridDim.x;
  return const_cast<i32 *>(state_merge_array(p)) + (states + kRound - 1) / kRound * kRound;
}

// The merge a split piece's partial state `state` belongs to (host-written: read while the piece's
// first tiles load, so the arrival at its end waits for no lookup).
struct PieceMerge {
  int index; // into merges[] and the merge counters
  fj_decode_merge merge;
};

__device__ __forceinline__ PieceMerge piece_merge(const fj_decode_params &p, int state) {
  PieceMerge m{0, {0, 0, 0, 0}};
  if constexpr (Cfg::kFusedMerge != 0)
    if (state >= 0) {
      m.index = ld_global_nc_s32(state_merge_array(p) + state);
      m.merge = load_merge(p.merges + m.index);
    }
  return m;
}

// Fused merge, called by every thread of a CTA once its partial state (of merge `pm`) is written. The
// barrier orders the CTA's state stores before thread 0's release (fence + acq_rel add) on the
// merge's counter; the arrival that completes the count acquires, so the other CTAs' states are
// visible to that CTA, which merges the unit (loads through L2: see ld_state_f32) and puts the
// counter back to zero for the next launch or graph replay (nothing else touches it in this grid:
// every arrival has happened). The counters are first touched after griddepcontrol.wait, so the
// previous step's grid, which used the same counters, has completed.
__device__ __forceinline__ void arrive_and_maybe_merge(const fj_decode_params &p, const PieceMerge &pm) {
  __syncthreads(); // every thread's partial-state stores, before thread 0's release below
  bool last = false;
  if (threadIdx.x == 0) {
    i32 *counter = merge_counter_array(p) + pm.index;
    fence_acq_rel_gpu();
    last = atom_add_acq_rel_gpu_s32(counter, 1) == pm.merge.count - 1;
    if (last)
      st_relaxed_gpu_s32(counter, 0);
  }
  if (!bar_red_or(last)) // uniform: thread 0's decision, to every thread
    return;
  fence_acq_rel_gpu(); // acquire for every thread: the states, after thread 0's acquire and the barrier
  FJ_DECODE_MARK(p, fj_mark_merge_start, global_timer_ns());
  merge_unit<Traits::kWarps, true>(p, pm.merge);
}

__device__ __forceinline__ void finish_piece(const fj_decode_params &p, const Unit &u, const Smem &smem, WarpState &st,
                                             const PieceMerge &pm) {
  const fj_attention_params &a = p.attn;
  const int lane = lane_id();
  const int group_row = lane / kQuadSize;
  const int quad_col = 2 * (lane % kQuadSize);
  float *stats = smem.stats();
  float *merge = smem.merge();
  float *warp_merge = merge + warp_id() * Cfg::kBlockM * Cfg::kMergeRowFloats;

  __syncthreads(); // every warp is done reading the ring, which `merge` aliases
#pragma unroll
  for (int m = 0; m < Traits::kMTiles; ++m) {
#pragma unroll
    for (int h = 0; h < kRowsPerThreadTile; ++h) {
      const int row = m * kMmaM + h * kHalfTile + group_row;
      const float sum = quad_reduce_sum(st.row_sum[m][h]);
      if (lane % kQuadSize == 0) {
        stats[(warp_id() * Cfg::kBlockM + row) * kStatsPerRow] = st.row_max[m][h];
        stats[(warp_id() * Cfg::kBlockM + row) * kStatsPerRow + 1] = sum;
      }
#pragma unroll
      for (int n = 0; n < Traits::kNTilesO; ++n) {
        float *dst = warp_merge + row * Cfg::kMergeRowFloats + n * kMmaN + quad_col;
        dst[0] = st.o[m][n][2 * h];
        dst[1] = st.o[m][n][2 * h + 1];
      }
    }
  }
  __syncthreads();

  // Threads sweep (row, 8-column chunk) pairs of the block; a row's weights are recomputed by each
  // of its chunks' threads (kWarps exponentials), cheaper than another barrier.
  constexpr int kChunksPerRow = Cfg::kHeadDimV / kMergeChunk;
  for (int c = (int)threadIdx.x; c < u.rows_here * kChunksPerRow; c += Cfg::kThreads) {
    const int row = c / kChunksPerRow;
    const int col = (c % kChunksPerRow) * kMergeChunk;
    float max_all = neg_inf();
#pragma unroll
    for (int w = 0; w < Traits::kWarps; ++w)
      max_all = max_f32(max_all, stats[(w * Cfg::kBlockM + row) * kStatsPerRow]);
    const bool empty = max_all == neg_inf();
    float weight[Traits::kWarps];
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < Traits::kWarps; ++w) {
      const float wmax = stats[(w * Cfg::kBlockM + row) * kStatsPerRow];
      weight[w] = empty ? 0.f : ex2_approx(wmax - max_all);
      total += weight[w] * stats[(w * Cfg::kBlockM + row) * kStatsPerRow + 1];
    }
    const float inv_total = total > 0.f ? rcp_approx(total) : 0.f;
    float out[kMergeChunk];
#pragma unroll
    for (int i = 0; i < kMergeChunk; ++i) {
      float acc = 0.f;
#pragma unroll
      for (int w = 0; w < Traits::kWarps; ++w)
        acc += weight[w] * merge[(w * Cfg::kBlockM + row) * Cfg::kMergeRowFloats + col + i];
      out[i] = acc * inv_total;
    }
    // Natural-log LSE of the row over this piece's keys: (max + log2 total) * ln 2.
    const float lse = total > 0.f ? (max_all + lg2_approx(total)) * kLn2 : neg_inf();

    const int packed = u.m_block * Cfg::kBlockM + row;
    if (u.state < 0) {
      const int token = packed / Cfg::kGqaGroup;
      const int head = u.head_kv * Cfg::kGqaGroup + packed % Cfg::kGqaGroup;
      u16 *dst = static_cast<u16 *>(const_cast<void *>(a.o.ptr)) + (i64)u.batch * a.o.batch_stride +
                 (i64)token * a.o.row_stride + (i64)head * a.o.head_stride + col;
      store_16bit<Cfg::kDType, Cfg::kAligned16>(dst, out);
      if (a.maybe_lse != nullptr && col == 0)
        st_global_f32(a.maybe_lse + ((i64)u.batch * a.heads_q + head) * a.seqlen_q + token, lse);
    } else {
      float *dst = a.maybe_partial_o + ((i64)u.state * Cfg::kBlockM + row) * Cfg::kHeadDimV + col;
#pragma unroll
      for (int h = 0; h < kMergeChunk / kF32PerVec; ++h) {
        const float v[kF32PerVec] = {out[h * kF32PerVec], out[h * kF32PerVec + 1], out[h * kF32PerVec + 2],
                                     out[h * kF32PerVec + 3]};
        st_global_v4_f32(dst + h * kF32PerVec, v);
      }
      if (col == 0)
        st_global_f32(a.maybe_partial_lse + (i64)u.state * Cfg::kBlockM + row, lse);
    }
  }
  FJ_DECODE_MARK(p, fj_mark_stored, global_timer_ns());
  if constexpr (Cfg::kFusedMerge != 0)
    if (u.state >= 0) // uniform over the CTA
      arrive_and_maybe_merge(p, pm);
  __syncthreads(); // the next piece's copies overwrite `merge` and `stats`
}

// ---- one piece -----------------------------------------------------------------------------------

// TMA tiles: the V rows of a tile at or past the piece's end are zeroed once the tile has landed.
// P is 0 there, but rows past the sequence are not ours to trust (NaN * 0 = NaN); the cp.async
// copies zero-fill them instead. Each writer fences before the TMA overwrites the stage.
__device__ __forceinline__ void zero_v_rows_past(const Smem &smem, int stage, int rows_valid) {
  constexpr int kChunksPerRow = TmaTile::kPanelsV * TmaTile::kSwizzleBytes / TmaTile::kChunkBytes;
  constexpr int kChunksPerPanelRow = TmaTile::kSwizzleBytes / TmaTile::kChunkBytes;
  char *v = reinterpret_cast<char *>(smem.v(stage));
  for (int c = (int)threadIdx.x; c < (Cfg::kBlockN - rows_valid) * kChunksPerRow; c += Cfg::kThreads) {
    const int row = rows_valid + c / kChunksPerRow;
    const int panel = (c % kChunksPerRow) / kChunksPerPanelRow;
    const int chunk = c % kChunksPerPanelRow;
    *reinterpret_cast<uint4 *>(v + panel * TmaTile::kPanelBytes + row * TmaTile::kSwizzleBytes +
                               chunk * TmaTile::kChunkBytes) = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async_shared();
}

// `first`: the CTA's first piece (timeline builds mark its first tile). TMA tiles: `kv_maps` are the
// K and V tensor maps, bit s of `phase_bits` the parity stage s's barrier completes next.
__device__ __forceinline__ void run_piece(const fj_decode_params &p, const Unit &u, const Smem &smem, bool first,
                                          const fj_tensor_map *kv_maps, u32 &phase_bits) {
  const fj_attention_params &a = p.attn;
  KvSource src = kv_source(a, u);
  src.maps = kv_maps;
  if constexpr (kTmaKv) { // the previous piece's merge scratch (generic stores) before the TMA writes
    fence_proxy_async_shared();
    __syncthreads();
  }
  zero_qk_padding(smem); // the previous piece's merge scratch may have covered the K padding
  const int num_tiles = (u.kv_end - u.kv_begin + Cfg::kBlockN - 1) / Cfg::kBlockN;

  // Prologue: pages of tiles 0 .. kStages-1 (their lookups go out together), then Q and the
  // first kStages - 1 tiles, one commit group per tile.
  if constexpr (Traits::kPaged && !kTmaKv) {
    i32 first_pages[Cfg::kStages];
#pragma unroll
    for (int t = 0; t < Cfg::kStages; ++t)
      first_pages[t] = src.lookup(t);
#pragma unroll
    for (int t = 0; t < Cfg::kStages; ++t)
      src.store_row_addrs(smem, t, first_pages[t]);
    __syncthreads();
  }
  load_q(a, u, smem);
  // TMA tiles, paged: the pages of the first kStages - 1 tiles are looked up together, so their
  // table reads overlap instead of each delaying its tile's loads.
  i32 first_group_pages[Cfg::kStages - 1] = {};
  if constexpr (kTmaKv && Traits::kPaged)
#pragma unroll
    for (int t = 0; t < Cfg::kStages - 1; ++t)
      first_group_pages[t] = src.group_page(t);
#pragma unroll
  for (int t = 0; t < Cfg::kStages - 1; ++t) {
    if (t < num_tiles)
      src.issue(smem, t, first_group_pages[t]);
    cp_async_commit_group(); // one group per tile, empty or not, keeps the wait count uniform
  }
  // Paged: cp.async copies, the page of this thread's row of tile kStages (stored at step 0, read
  // by the copies at step 1); TMA tiles, the page of its row group of tile kStages - 1.
  i32 next_page = kTmaKv ? src.group_page(Cfg::kStages - 1) : src.lookup(Cfg::kStages);
  const PieceMerge pm = piece_merge(p, u.state);

  RowRange ranges[Traits::kMTiles][kRowsPerThreadTile];
#pragma unroll
  for (int m = 0; m < Traits::kMTiles; ++m)
#pragma unroll
    for (int h = 0; h < kRowsPerThreadTile; ++h)
      ranges[m][h] = row_range(a, u, m * kMmaM + h * kHalfTile + lane_id() / kQuadSize);

  WarpState st;
  st.reset();
  QFragments q_held; // kHoldQ only
  for (int t = 0; t < num_tiles; ++t) {
    if constexpr (kTmaKv) {
      if (t == 0)
        cp_async_wait_all(); // Q, the only cp.async copies
      const int stage = t % Cfg::kStages;
      mbarrier_wait_parity(smem.full_bar(stage), (phase_bits >> stage) & 1u);
      phase_bits ^= 1u << stage;
      const int rows_valid = u.kv_end - (u.kv_begin + t * Cfg::kBlockN);
      if (rows_valid < Cfg::kBlockN)
        zero_v_rows_past(smem, stage, rows_valid);
    } else {
      cp_async_wait_group<Cfg::kStages - 2>(); // tile t (and Q) has landed for this thread
    }
    __syncthreads(); // ... and for every thread; stage t-1 is free again
#ifdef FJ_DECODE_TIMELINE
    if (first && t == 0)
      FJ_DECODE_MARK(p, fj_mark_first_tile, global_timer_ns());
#endif
    const int ahead = t + Cfg::kStages - 1;
    if (ahead < num_tiles)
      src.issue(smem, ahead, next_page);
    cp_async_commit_group();
    if constexpr (kTmaKv && Traits::kPaged) {
      if (ahead + 1 < num_tiles)
        next_page = src.group_page(ahead + 1);
    } else if constexpr (Traits::kPaged) {
      // Slot (t + kStages) % kStages is tile t's, whose copies went out kStages - 1 steps ago.
      if (ahead + 1 < num_tiles) {
        src.store_row_addrs(smem, ahead + 1, next_page);
        next_page = src.lookup(ahead + 2);
      }
    }

    const int stage = t % Cfg::kStages;
    const int tile_key = u.kv_begin + t * Cfg::kBlockN;
    float s[Traits::kMTiles][Traits::kNTilesS][4];
    if constexpr (kHoldQ) {
      if (t == 0) // Q landed with tile 0's group
#pragma unroll
        for (int ks = 0; ks < Traits::kKStepsQK; ++ks)
          load_q_fragments(smem, ks, q_held[ks]);
      qk_gemm(smem, stage, s, [&](int ks, u32(&a)[Traits::kMTiles][4]) {
#pragma unroll
        for (int m = 0; m < Traits::kMTiles; ++m)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            a[m][i] = q_held[ks][m][i];
      });
    } else {
      qk_gemm(smem, stage, s, [&](int ks, u32(&a)[Traits::kMTiles][4]) { load_q_fragments(smem, ks, a); });
    }
    online_softmax(a, s, ranges, tile_key, st);
    pv_gemm(smem, stage, s, st);
  }
  cp_async_wait_all(); // only empty groups remain, or Q when the piece has no tile
  FJ_DECODE_MARK(p, fj_mark_loop_end, global_timer_ns());
  finish_piece(p, u, smem, st, pm);
}

// The kernel's parameter block: fj_decode_params, followed by the K/V tensor maps with TMA tiles.
template <bool kWithMaps> struct EntryParams { using type = fj_decode_params; };
template <> struct EntryParams<true> { using type = fj_decode_tma_params; };
__device__ __forceinline__ const fj_decode_params &decode_params(const fj_decode_params &p) {
  return p;
}
__device__ __forceinline__ const fj_decode_params &decode_params(const fj_decode_tma_params &e) {
  return e.base;
}
__device__ __forceinline__ const fj_tensor_map *kv_maps(const fj_decode_params &) {
  return nullptr;
}
__device__ __forceinline__ const fj_tensor_map *kv_maps(const fj_decode_tma_params &e) {
  return &e.k_map;
}
} // namespace fj::decode

// kCtasPerSm CTAs share an SM (the plan sized their rings for it); the bound keeps ptxas inside the
// register budget that allows it.
extern "C" __global__ void __launch_bounds__(KernelConfig::kThreads, KernelConfig::kCtasPerSm)
    fj_decode_splitk(const __grid_constant__ fj::decode::EntryParams<fj::decode::kTmaKv>::type entry) {
  const fj_decode_params &p = fj::decode::decode_params(entry);
  const fj_tensor_map *kv_maps = fj::decode::kv_maps(entry);
  extern __shared__ __align__(128) char smem_raw[];
  // TMA tiles: the swizzle atoms need the map's offsets from a 1024-byte boundary (the plan leaves
  // that much room); other builds take the block as it comes.
  const fj::u32 smem_pad =
      fj::decode::kTmaKv ? (0u - fj::cvta_to_shared_u32(smem_raw)) % fj::decode::TmaTile::kAtomBytes : 0u;
  const fj::decode::Smem smem{smem_raw + smem_pad};
  FJ_DECODE_MARK(p, fj_mark_entry, fj::global_timer_ns());
  // The next grid of the stream (the combine, or with kFusedMerge the next step's decode) may get
  // resident now and wait (PDL).
  if constexpr (KernelConfig::kArch >= 90)
    fj::griddepcontrol_launch_dependents();
  const int first = p.slot_begin[blockIdx.x];
  const int last = p.slot_begin[blockIdx.x + 1];
  if (first == last) // no work: this CTA touches no memory, so it need not wait (PDL) either
    return;
  // The work list is the host's (no kernel writes it): read before the wait. Q, K, V, lengths and
  // tables may come from the previous kernel of the stream: read after it, as are the partial
  // states, O and (kFusedMerge) the merge counters, which the previous step's grid also writes.
  // The wait is conditional on the loaded entry only so that its load issues before the wait
  // (ptxas sinks an unconditional one below it); an entry always has kv_begin <= kv_end.
  const fj_decode_work first_work = fj::decode::load_work(p.work + first);
  if constexpr (KernelConfig::kArch >= 90)
    if (first_work.kv_begin <= first_work.kv_end)
      fj::griddepcontrol_wait();
  FJ_DECODE_MARK(p, fj_mark_waited, fj::global_timer_ns());
  fj::u32 phase_bits = 0; // TMA tiles
  if constexpr (fj::decode::kTmaKv) {
    if (threadIdx.x == 0) {
      for (int stage = 0; stage < KernelConfig::kStages; ++stage)
        fj::mbarrier_init(smem.full_bar(stage), 1);
      fj::fence_mbarrier_init();
    }
    __syncthreads();
  }
  for (int i = first; i < last; ++i) {
    const fj::decode::Unit u = fj::decode::decode_unit(p, i == first ? first_work : fj::decode::load_work(p.work + i));
    fj::decode::run_piece(p, u, smem, i == first, kv_maps, phase_bits);
  }
  FJ_DECODE_MARK(p, fj_mark_exit, fj::global_timer_ns());
  FJ_DECODE_MARK(p, fj_mark_sm_pieces, fj::sm_id() | (unsigned long long)(last - first) << 32);
}

// Merges the partial states of split units: CTA x handles merges[x] (the grid is fixed; CTAs past
// header->num_merges return). One warp per packed row. Launched right after fj_decode_splitk when
// its plan does not fuse the merge (kFusedMerge 0), on sm_90 with programmatic stream
// serialization (PDL) so its launch hides behind the decode. Min blocks 1: see fj_combine.
extern "C" __global__ void __launch_bounds__(KernelConfig::kCombineThreads, 1)
    fj_decode_combine(const __grid_constant__ fj_decode_params p) {
  if constexpr (KernelConfig::kArch >= 90) {
    // The next step's decode (PDL) may get resident now; it waits for this grid before touching
    // anything this grid reads or writes.
    fj::griddepcontrol_launch_dependents();
    fj::griddepcontrol_wait(); // launched with PDL: wait for the decode grid's partials
  }
  if ((int)blockIdx.x >= p.header->num_merges)
    return;
  constexpr int kWarps = KernelConfig::kCombineThreads / fj::kWarpSize;
  fj::decode::merge_unit<kWarps, false>(p, fj::decode::load_merge(p.merges + blockIdx.x));
}
