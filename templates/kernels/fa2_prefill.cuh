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
#include "prim/address.cuh"
#include "prim/cp_async.cuh"
#include "prim/ld_global.cuh"
#include "prim/ldmatrix.cuh"
#include "prim/math.cuh"
#include "prim/mma.cuh"
#include "prim/types.cuh"
#include "prim/warp.cuh"

namespace fj::fa2 {

using Cfg = KernelConfig;

// The m16n8k16 MMA shape and how a 16-bit row splits into 16-byte chunks.
constexpr int kMmaM = 16;
constexpr int kMmaN = 8;
constexpr int kMmaK = 16;
constexpr int kHalfMmaK = kMmaK / 2; // ldmatrix matrices are 8 columns wide
constexpr int kElemBytes = 2;
constexpr int kChunkElems = kCpAsyncBytes / kElemBytes;

constexpr int kChunksQK = Cfg::kHeadDimQK / kChunkElems; // 16-byte chunks per Q/K row
constexpr int kChunksV = Cfg::kHeadDimV / kChunkElems;   // per V/O row
// The ring schedule runs the math of a key block in sub-blocks of kSubBlockN keys, each a whole
// QK -> softmax -> PV step, in a loop that is not unrolled, so a thread holds the S accumulators
// of one sub-block only; the copies and the barrier stay per kBlockN keys. The planner uses one
// step per block (kSubBlockN = kBlockN): several steps were measured slower than one step of the
// same keys (perf-notes "fa2: key blocks past the budget"); Fa2Tuning::sub_block_n sets it.
constexpr int kSubBlocks = Cfg::kBlockN / Cfg::kSubBlockN;
constexpr int kTilesN = Cfg::kSubBlockN / kMmaN;     // S fragments per warp row block
constexpr int kTilesDV = Cfg::kHeadDimV / kMmaN;     // O fragments (exactly head_dim_v)
constexpr int kStepsQK = Cfg::kHeadDimQKPad / kMmaK; // k-steps of Q K^T (zero-padded)
constexpr int kStepsPV = Cfg::kSubBlockN / kMmaK;    // k-steps of P V per sub-block
constexpr int kMBlocks = Cfg::kRowsPerWarp / kMmaM;  // m16 row blocks per warp (1 or 2)
// The scale goes into the exponent, exp2(s * scale_log2 - max * scale_log2) as one FFMA, instead
// of a separate multiply of every logit (the max commutes with a positive scale). A softcap needs
// the scaled logit for its tanh, so it keeps the pass. Only the 32-row schedule folds for now: the
// 16-row one keeps its GPU-verified arithmetic bit for bit until the new path has been measured.
constexpr bool kFoldScale = kMBlocks > 1 && !Cfg::kSoftcap;
// Ring schedule with kStages >= 2, else the interleaved single-buffer one (see the top).
constexpr bool kRing = Cfg::kStages >= 2;
// Blocks loaded before the loop: the ring keeps kStages - 1 blocks ahead of the one in use.
constexpr int kPrologueBlocks = kRing ? Cfg::kStages - 1 : 1;
// Groups still allowed in flight once the K (or V) block about to be used has landed: the ring
// waits for K_j and V_j together behind kStages - 2 younger blocks; the single-buffer schedule
// waits for K_j behind V_j, and for V_j behind the refill of K.
constexpr int kGroupsInFlight = kRing ? 2 * (Cfg::kStages - 2) : 1;

static_assert(Cfg::kRowsPerWarp % kMmaM == 0 && kMBlocks >= 1 && kMBlocks <= 2, "one or two m16 blocks per warp");
static_assert(Cfg::kWarps * kWarpSize == Cfg::kThreads && Cfg::kWarps * Cfg::kRowsPerWarp == Cfg::kBlockM);
static_assert(Cfg::kSubBlockN % kMmaK == 0, "sub-blocks are whole k-steps of P V");
static_assert(Cfg::kBlockN % Cfg::kSubBlockN == 0 && (kRing || kSubBlocks == 1),
              "sub-blocks tile the key block; the single-buffer schedule has one");
static_assert(Cfg::kHeadDimQK % kChunkElems == 0 && Cfg::kHeadDimV % kChunkElems == 0);
static_assert(Cfg::kHeadDimQKPad % kMmaK == 0 && Cfg::kHeadDimQKPad >= Cfg::kHeadDimQK &&
              Cfg::kHeadDimQKPad - Cfg::kHeadDimQK < kMmaK);
static_assert(Cfg::kSmemStrideQ >= Cfg::kHeadDimQKPad && Cfg::kSmemStrideK >= Cfg::kHeadDimQKPad &&
              Cfg::kSmemStrideV >= Cfg::kHeadDimV && Cfg::kSmemStrideO >= Cfg::kHeadDimV);
static_assert(Cfg::kSmemStrideQ % kChunkElems == 0 && Cfg::kSmemStrideK % kChunkElems == 0 &&
              Cfg::kSmemStrideV % kChunkElems == 0 && Cfg::kSmemStrideO % kChunkElems == 0);
static_assert(Cfg::kHeadDimQKPad == Cfg::kHeadDimQK || Cfg::kHeadDimQKPad - Cfg::kHeadDimQK == kChunkElems,
              "the K-dim padding is at most one chunk");
static_assert(Cfg::kStages >= 1 && Cfg::kPageSize >= 0);

// Page size as a divisor that is never 0 (contiguous KV never divides by it; the branch is only
// discarded, not skipped, outside a template).
constexpr int kPageRows = Cfg::kPageSize > 0 ? Cfg::kPageSize : 1;

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

// Query tile -> shared memory (one commit group).
__device__ __forceinline__ void load_q(const fj_attention_params &p, const Tile &t, u16 *smem_q) {
  const u16 *q = t.q + (i64)t.m0 * p.q.row_stride;
  load_tile<Cfg::kBlockM, kChunksQK, Cfg::kSmemStrideQ>(
      smem_q, t.seqlen_q - t.m0, [&](int row) { return q + (i64)row * p.q.row_stride; }, t.q);
  cp_async_commit_group();
}

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
          const u8 *row = advance_bytes(from, page, page_bytes);
          src = kPageRows > 1 ? advance_bytes(row, (i32)(key % kPageRows), row_bytes) : row;
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
