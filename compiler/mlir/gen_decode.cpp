// The split-K decode kernel (templates/kernels/decode_splitk.cuh) built with MLIR: entries
// fj_decode_splitk (a persistent CTA runs its slice of the host's work list; per piece a kStages
// cp.async ring of K/V tiles, S = Q K^T and O += P V with mma.sync m16n8k16, online softmax per warp,
// warps merged through shared memory; with kFusedMerge the last CTA to finish one of a split unit's
// pieces merges the unit, per-unit arrival counters) and fj_decode_combine (merge of the split
// units' partial states, one warp per packed row, for plans without kFusedMerge). Same plan
// constants, entry names and fj_decode_params block.
//
// Covered: contiguous and paged KV, 16-byte aligned rows (cp.async) and element-aligned rows
// (synchronous 16-bit loads and stores), head dims that are multiples of 8 (8 mod 16: QK's last k
// step zero-padded in shared memory, P.V's odd n8 tile through ldmatrix .x2), bf16/fp16, any GQA
// group and q_len of the plan, causal, sliding window, softcap.
// Paged KV: a block-table page ring (lookups one step ahead of their smem slot, two ahead of the
// copies that read it), each copy computing its row's address from the page. The template keeps a
// ring of row addresses instead; the MLIR build of that ring stopped on the H200 with an illegal
// instruction (session 5, perf-notes), this form passes parity bit for bit. Both fit the plan's
// ring region.
// Q's A fragments, as in the template (kHoldQ, session 13: +0.2..1%), stay in registers for the
// whole piece where they fit kMaxHeldQRegisters (head dims up to 128): loaded once before the key
// loop, behind a wait and a barrier of their own; at larger head dims every tile loads them from
// shared memory. Same fragments, same mma order either way.
#include "compiler/mlir/emit_mma.hpp"
#include "compiler/mlir/generators.hpp"
#include "compiler/mlir/merge_states.hpp"

#include "params_decode.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace flashjit::mlirgen {
namespace {

using mlir::Value;
using mlir::ValueRange;
namespace arith = mlir::arith;
namespace scf = mlir::scf;
using Pred = arith::CmpIPredicate;

constexpr int kRowsPerThreadTile = 2; // rows of a C fragment per thread and m tile
constexpr int kStatsPerRow = 2;       // (max, sum)
constexpr int kMergeChunk = 8;        // output columns per thread of the warp merge
constexpr int kWorkFields = 4;        // fj_decode_work / fj_decode_merge: four int32
constexpr int kI32Bytes = 4;          // a block-table entry (page index)

// --- parameter block ----------------------------------------------------------------------------

// Fields of fj_decode_params after attn (fj_attention_params, field 0; see emit_mma.hpp).
enum DecodeField { kAttn, kHeader, kSlotBegin, kWork, kMerges, kMBlocksField, kPadField };
static_assert(offsetof(fj_decode_params, header) == 272 && offsetof(fj_decode_params, m_blocks) == 304 &&
                  sizeof(fj_decode_params) == 312 && sizeof(fj_decode_work) == kWorkFields * 4 &&
                  sizeof(fj_decode_merge) == kWorkFields * 4,
              "decode_params_type below mirrors templates/params_decode.h field for field");

mlir::LLVM::LLVMStructType decode_params_type(Emitter &e) {
  mlir::Type p = e.ptr(), i32 = e.i32();
  return mlir::LLVM::LLVMStructType::getLiteral(e.b.getContext(), {attention_params_type(e), p, p, p, p, i32, i32});
}

// The compile-time shape: KernelConfig of the NVRTC build (spec + plan constants) and its Traits.
struct Shape {
  DType dtype;
  int arch, head_dim_qk, head_dim_v, gqa_group, threads, page_size;
  bool causal, local, softcap, aligned16;
  int block_m, block_n, warp_n, stages, m_tiles, ctas_per_sm, combine_threads, head_dim_qk_mma;
  int smem_row_qk, smem_row_v, smem_offset_q, smem_offset_kv, smem_stage_bytes, smem_offset_v_in_stage,
      smem_offset_stats, smem_offset_pages, merge_row_floats;
  int kv_l2_hints; // plan constant kKvL2Hints: K/V copies with an L2 evict-first policy + 128 B prefetch
  int fused_merge; // plan constant kFusedMerge: the decode grid merges its split units (arrival counters)
  int warps() const { return threads / kWarpSize; }
  bool paged() const { return page_size > 0; }
  int n_tiles_s() const { return warp_n / kMmaN; }
  int k_steps_pv() const { return warp_n / kMmaK; }
  int k_steps_qk() const { return head_dim_qk_mma / kMmaK; }
  int n_tiles_o() const { return head_dim_v / kMmaN; }
};

// Runtime values read once per kernel.
struct Params {
  Value q, k, v, o, q_strides[3], k_strides[3], v_strides[3], o_strides[3];
  Value maybe_lse, maybe_seqlens_k, seqlen_q, seqlen_k, heads_q, heads_kv, window_left, window_right;
  Value scale_log2, softcap, softcap_inv, scale, partial_o, partial_lse, m_blocks;
  Value block_table, max_pages_per_seq, page_stride_k, page_stride_v; // paged KV
  // The parameter block itself, for fields read where they are used (the fused merge's merge list):
  // a load at the kernel's start would stay live across the key loop.
  Value block;
  mlir::LLVM::LLVMStructType block_type;
};

Params load_params(Emitter &e, Value p, mlir::LLVM::LLVMStructType t) {
  Params r;
  auto tensor = [&](int which, Value *ptr, Value(&strides)[3]) {
    *ptr = param_at(e, p, t, {kAttn, which, kPtr});
    strides[0] = param_at(e, p, t, {kAttn, which, kBatchStride});
    strides[1] = param_at(e, p, t, {kAttn, which, kRowStride});
    strides[2] = param_at(e, p, t, {kAttn, which, kHeadStride});
  };
  tensor(kQ, &r.q, r.q_strides);
  tensor(kK, &r.k, r.k_strides);
  tensor(kV, &r.v, r.v_strides);
  tensor(kO, &r.o, r.o_strides);
  r.maybe_lse = param_at(e, p, t, {kAttn, kMaybeLse});
  r.maybe_seqlens_k = param_at(e, p, t, {kAttn, kMaybeSeqlensK});
  r.seqlen_q = param_at(e, p, t, {kAttn, kSeqlenQ});
  r.seqlen_k = param_at(e, p, t, {kAttn, kSeqlenK});
  r.heads_q = param_at(e, p, t, {kAttn, kHeadsQ});
  r.heads_kv = param_at(e, p, t, {kAttn, kHeadsKv});
  r.window_left = param_at(e, p, t, {kAttn, kWindowLeft});
  r.window_right = param_at(e, p, t, {kAttn, kWindowRight});
  r.scale_log2 = param_at(e, p, t, {kAttn, kScaleLog2});
  r.softcap = param_at(e, p, t, {kAttn, kSoftcapField});
  r.softcap_inv = param_at(e, p, t, {kAttn, kSoftcapInv});
  r.scale = param_at(e, p, t, {kAttn, kScale});
  r.partial_o = param_at(e, p, t, {kAttn, kPartialO});
  r.partial_lse = param_at(e, p, t, {kAttn, kPartialLse});
  r.m_blocks = param_at(e, p, t, {kMBlocksField});
  r.block_table = param_at(e, p, t, {kAttn, kPaged, kBlockTable});
  r.max_pages_per_seq = param_at(e, p, t, {kAttn, kPaged, kMaxPagesPerSeq});
  r.page_stride_k = param_at(e, p, t, {kAttn, kPaged, kPageStrideK});
  r.page_stride_v = param_at(e, p, t, {kAttn, kPaged, kPageStrideV});
  return r;
}

// decode_unit of kernels/decode/work.cuh.
struct Unit {
  Value batch, head_kv, m_block, kv_begin, kv_end, state, kv_len, rows_here;
};

Unit decode_unit(Emitter &e, const Shape &sh, const Params &p, Value unit, bool with_kv_len) {
  Unit u;
  u.m_block = e.rem_s(unit, p.m_blocks);
  Value pair = e.div_s(unit, p.m_blocks);
  u.head_kv = e.rem_s(pair, p.heads_kv);
  u.batch = e.div_s(pair, p.heads_kv);
  if (with_kv_len) {
    auto kv_len = scf::IfOp::create(e.b, e.loc, mlir::TypeRange{e.i32()}, e.is_null(p.maybe_seqlens_k), true);
    mlir::OpBuilder::InsertionGuard guard(e.b);
    e.b.setInsertionPointToStart(kv_len.thenBlock());
    scf::YieldOp::create(e.b, e.loc, p.seqlen_k);
    e.b.setInsertionPointToStart(kv_len.elseBlock());
    scf::YieldOp::create(e.b, e.loc, e.ld_global_nc_s32(e.gep(p.maybe_seqlens_k, e.i32(), e.sext64(u.batch))));
    u.kv_len = kv_len.getResult(0);
  }
  Value rows = e.mul(e.c_i32(sh.gqa_group), p.seqlen_q);
  Value first = e.mul(u.m_block, e.c_i32(sh.block_m));
  u.rows_here = e.min_s(e.sub(rows, first), e.c_i32(sh.block_m));
  return u;
}

// --- shared memory ------------------------------------------------------------------------------

struct Smem {
  Value base; // !llvm.ptr<3>
  Emitter &e;
  const Shape &sh;
  Value at(Value byte_offset) const { return e.gep(base, e.b.getI8Type(), byte_offset); }
  Value q() const { return at(e.c_i32(sh.smem_offset_q)); }
  Value k(Value stage) const {
    return at(e.add(e.c_i32(sh.smem_offset_kv), e.mul(stage, e.c_i32(sh.smem_stage_bytes))));
  }
  Value v(Value stage) const {
    return at(
        e.add(e.c_i32(sh.smem_offset_kv + sh.smem_offset_v_in_stage), e.mul(stage, e.c_i32(sh.smem_stage_bytes))));
  }
  // Paged KV: page of every row of the tile in `stage` (i32).
  Value pages(Value stage) const {
    return at(e.add(e.c_i32(sh.smem_offset_pages), e.mul(stage, e.c_i32(sh.block_n * kI32Bytes))));
  }
  Value stats() const { return at(e.c_i32(sh.smem_offset_stats)); }
  Value merge() const { return at(e.c_i32(sh.smem_offset_kv)); } // aliases the idle ring
};

// --- global -> shared copies --------------------------------------------------------------------

// copy_chunk: one 16-byte chunk of 16-bit elements into shared memory. Aligned rows go through
// cp.async, zero-filling a chunk past the end (`src` then only needs to be a valid address);
// element-aligned rows load synchronously, eight 16-bit loads, zeros when not valid. `source()`
// gives the chunk's address and is evaluated only for valid chunks on the synchronous path.
template <typename Source>
void copy_chunk(Emitter &e, const Shape &sh, Value dst, Value valid, Value fallback, Source &&source) {
  mlir::Type i16 = e.b.getI16Type();
  if (sh.aligned16) {
    e.cp_async_cg_16(dst, e.select(valid, source(), fallback), e.select(valid, e.c_i32(kChunkBytes), e.c_i32(0)));
    return;
  }
  auto v8i16 = mlir::VectorType::get({kChunkElems}, i16);
  Value chunk = if_values(
      e, valid, mlir::TypeRange{v8i16},
      [&] {
        Value from = source();
        llvm::SmallVector<Value, kChunkElems> elems;
        for (int i = 0; i < kChunkElems; ++i) // ld.global.nc.b16
          elems.push_back(mlir::LLVM::LoadOp::create(e.b, e.loc, i16, e.to_global(e.gep(from, i16, e.c_i32(i))),
                                                     kElemBytes, false, false, /*isInvariant=*/true));
        return llvm::SmallVector<Value, 1>{mlir::vector::FromElementsOp::create(e.b, e.loc, v8i16, elems)};
      },
      [&] {
        return llvm::SmallVector<Value, 1>{
            arith::ConstantOp::create(e.b, e.loc, mlir::DenseElementsAttr::get(v8i16, e.b.getIntegerAttr(i16, 0)))};
      })[0];
  // the chunk's shared address is 16-byte aligned (rows and columns are multiples of 8 elements)
  auto v4i32 = mlir::VectorType::get({kChunkBytes / kI32Bytes}, e.i32());
  e.st_shared(dst, mlir::LLVM::BitcastOp::create(e.b, e.loc, v4i32, chunk), kChunkBytes);
}

// copy_kv_chunk of kernels/decode/copies.cuh: copy_chunk, or with kKvL2Hints (aligned rows) prim/cp_async_l2.cuh's
// cp.async.cg.shared.global.L2::cache_hint.L2::128B [dst], [src], 16, src_bytes, policy
template <typename Source>
void copy_kv_chunk(Emitter &e, const Shape &sh, Value dst, Value valid, Value fallback, Value policy, Source &&source) {
  if (!(sh.aligned16 && sh.kv_l2_hints != 0)) {
    copy_chunk(e, sh, dst, valid, fallback, source);
    return;
  }
  Value dst_u32 = mlir::LLVM::PtrToIntOp::create(e.b, e.loc, e.i32(), dst);
  Value src = e.to_global(e.select(valid, source(), fallback));
  Value bytes = e.select(valid, e.c_i32(kChunkBytes), e.c_i32(0));
  e.asm_void({dst_u32, src, bytes, policy}, "cp.async.cg.shared.global.L2::cache_hint.L2::128B [$0], [$1], 16, $2, $3;",
             "r,l,r,l,~{memory}");
}

// llvm.loop.unroll.disable on a thread-strided loop. LLVM runtime-unrolls them (the trip count
// starts at tid, so it is unknown), and the extra live addresses cost registers in the key loop
// (measured, sm_80 d128 g4: paged q1 168 -> 150, contiguous q4 208 -> 157; NVRTC 146 / 172).
void keep_rolled(Emitter &e, scf::ForOp loop) {
  mlir::MLIRContext *c = e.b.getContext();
  auto unroll = mlir::LLVM::LoopUnrollAttr::get(c, e.b.getBoolAttr(true), {}, {}, {}, {}, {}, {});
  loop->setAttr("loop_annotation",
                mlir::LLVM::LoopAnnotationAttr::get(c, {}, {}, {}, unroll, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}));
}

// Rows of `dim` elements: chunk c = tid, tid + threads, ... < rows * chunks_per_row; row c / cpr.
// `row_offset(row)` gives the i64 element offset of a tile row from `base` (through the block table
// when paged); invalid rows read nothing (cp.async zero-fills from `base`). `policy`: the L2 policy
// of the copies (kKvL2Hints).
template <typename RowOffset>
void copy_rows(Emitter &e, const Shape &sh, Value smem, int rows, int dim, int smem_row, Value rows_valid, Value base,
               Value policy, RowOffset &&row_offset) {
  const int chunks_per_row = dim / kChunkElems;
  auto loop = scf::ForOp::create(e.b, e.loc, e.tid_x(), e.c_i32(rows * chunks_per_row), e.c_i32(sh.threads),
                                 ValueRange{}, [&](mlir::OpBuilder &, mlir::Location, Value c, ValueRange) {
                                   Value row = e.div_s(c, e.c_i32(chunks_per_row));
                                   Value col = e.mul(e.rem_s(c, e.c_i32(chunks_per_row)), e.c_i32(kChunkElems));
                                   Value valid = e.cmp(Pred::slt, row, rows_valid);
                                   Value dst = e.gep(smem, e.b.getI16Type(), e.add(e.mul(row, e.c_i32(smem_row)), col));
                                   copy_kv_chunk(e, sh, dst, valid, base, policy, [&] {
                                     return e.gep(base, e.b.getI16Type(), e.add(row_offset(row), e.sext64(col)));
                                   });
                                   scf::YieldOp::create(e.b, e.loc);
                                 });
  keep_rolled(e, loop);
}

// KvSource of kernels/decode/copies.cuh: per-piece addressing of K and V. Paged: k / v point at the head's
// slice of page 0; `table` is the sequence's block-table row. As there, a piece may start at any
// key: tiles count from kv_begin and every row looks up its own page.
struct KvSource {
  Value k, v, k_row, v_row, k_page, v_page, table, kv_begin, kv_end;
  Value policy; // L2 policy of the copies (kKvL2Hints; a zero otherwise)
};

// KvSource::lookup: page of row `tid` of `tile` (0 past the end, or for threads past the tile).
Value lookup_page(Emitter &e, const Shape &sh, const KvSource &src, Value tile) {
  Value tid = e.tid_x();
  Value key = e.add(e.add(src.kv_begin, e.mul(tile, e.c_i32(sh.block_n))), tid);
  Value wanted = e.and_(e.cmp(Pred::slt, tid, e.c_i32(sh.block_n)), e.cmp(Pred::slt, key, src.kv_end));
  return if_values(
      e, wanted, mlir::TypeRange{e.i32()},
      [&] {
        Value slot = e.sext64(e.div_s(key, e.c_i32(sh.page_size)));
        return llvm::SmallVector<Value, 1>{e.ld_global_nc_s32(e.gep(src.table, e.i32(), slot))};
      },
      [&] { return llvm::SmallVector<Value, 1>{e.c_i32(0)}; })[0];
}

// KvSource::store_pages: thread r < kBlockN keeps row r's page in the slot of `tile`.
void store_pages(Emitter &e, const Shape &sh, const Smem &smem, Value tile, Value page) {
  Value tid = e.tid_x();
  when(e, e.cmp(Pred::slt, tid, e.c_i32(sh.block_n)), [&] {
    Value slot = smem.pages(e.rem_s(tile, e.c_i32(sh.stages)));
    e.st_shared(e.gep(slot, e.i32(), tid), page, kI32Bytes);
  });
}

// KvSource::issue: tile `tile` into stage tile % kStages.
void issue_tile(Emitter &e, const Shape &sh, const Smem &smem, const KvSource &src, Value tile) {
  mlir::Type i16 = e.b.getI16Type();
  Value key0 = e.add(src.kv_begin, e.mul(tile, e.c_i32(sh.block_n)));
  Value rows_valid = e.sub(src.kv_end, key0);
  Value stage = e.rem_s(tile, e.c_i32(sh.stages));
  if (sh.paged()) {
    Value pages = smem.pages(stage);
    auto paged_row = [&](Value page_stride, Value row_stride) {
      return [&e, &sh, pages, key0, page_stride, row_stride](Value row) {
        Value page = e.ld_shared(e.i32(), e.gep(pages, e.i32(), row), kI32Bytes);
        Value in_page = e.rem_s(e.add(key0, row), e.c_i32(sh.page_size));
        return e.add(e.mul(e.sext64(page), page_stride), e.mul(e.sext64(in_page), row_stride));
      };
    };
    copy_rows(e, sh, smem.k(stage), sh.block_n, sh.head_dim_qk, sh.smem_row_qk, rows_valid, src.k, src.policy,
              paged_row(src.k_page, src.k_row));
    copy_rows(e, sh, smem.v(stage), sh.block_n, sh.head_dim_v, sh.smem_row_v, rows_valid, src.v, src.policy,
              paged_row(src.v_page, src.v_row));
    return;
  }
  Value key0_64 = e.sext64(key0);
  Value k_base = e.gep(src.k, i16, e.mul(key0_64, src.k_row));
  Value v_base = e.gep(src.v, i16, e.mul(key0_64, src.v_row));
  auto contiguous_row = [&e](Value row_stride) {
    return [&e, row_stride](Value row) { return e.mul(e.sext64(row), row_stride); };
  };
  copy_rows(e, sh, smem.k(stage), sh.block_n, sh.head_dim_qk, sh.smem_row_qk, rows_valid, k_base, src.policy,
            contiguous_row(src.k_row));
  copy_rows(e, sh, smem.v(stage), sh.block_n, sh.head_dim_v, sh.smem_row_v, rows_valid, v_base, src.policy,
            contiguous_row(src.v_row));
}

// zero_qk_padding: columns [head_dim_qk, head_dim_qk_mma) of Q and of every K stage are the zero
// padding of the last QK k step (head dims of 8 mod 16); no copy writes them, but the previous
// piece's merge scratch (which aliases the ring) may have, so every piece zeroes them again.
void zero_qk_padding(Emitter &e, const Shape &sh, const Smem &smem) {
  if (sh.head_dim_qk_mma == sh.head_dim_qk)
    return;
  auto v4i32 = mlir::VectorType::get({kChunkBytes / kI32Bytes}, e.i32());
  Value zero = arith::ConstantOp::create(e.b, e.loc, mlir::DenseElementsAttr::get(v4i32, e.b.getI32IntegerAttr(0)));
  auto zero_pad = [&](int rows, auto &&row_start) {
    scf::ForOp::create(e.b, e.loc, e.tid_x(), e.c_i32(rows), e.c_i32(sh.threads), ValueRange{},
                       [&](mlir::OpBuilder &, mlir::Location, Value r, ValueRange) {
                         e.st_shared(e.gep(row_start(r), e.b.getI16Type(), e.c_i32(sh.head_dim_qk)), zero, kChunkBytes);
                         scf::YieldOp::create(e.b, e.loc);
                       });
  };
  zero_pad(sh.block_m, [&](Value r) { return e.gep(smem.q(), e.b.getI16Type(), e.mul(r, e.c_i32(sh.smem_row_qk))); });
  zero_pad(sh.stages * sh.block_n, [&](Value r) {
    Value stage = e.div_s(r, e.c_i32(sh.block_n));
    return e.gep(smem.k(stage), e.b.getI16Type(), e.mul(e.rem_s(r, e.c_i32(sh.block_n)), e.c_i32(sh.smem_row_qk)));
  });
}

// --- the per-warp state: O fragments, row max (base-2), row sum ----------------------------------

struct WarpState {
  std::vector<std::array<Value, kFragment>> o; // [m][n]
  std::vector<Value> row_max, row_sum;         // [m][h]
  int m_tiles, n_tiles;
  std::array<Value, kFragment> &acc(int m, int n) { return o[m * n_tiles + n]; }

  std::vector<Value> flatten() const {
    std::vector<Value> all;
    for (const auto &f : o)
      all.insert(all.end(), f.begin(), f.end());
    all.insert(all.end(), row_max.begin(), row_max.end());
    all.insert(all.end(), row_sum.begin(), row_sum.end());
    return all;
  }
  static WarpState from(ValueRange values, int m_tiles, int n_tiles) {
    WarpState st{{}, {}, {}, m_tiles, n_tiles};
    size_t i = 0;
    for (int f = 0; f < m_tiles * n_tiles; ++f) {
      std::array<Value, kFragment> frag;
      for (Value &x : frag)
        x = values[i++];
      st.o.push_back(frag);
    }
    for (int r = 0; r < m_tiles * kRowsPerThreadTile; ++r)
      st.row_max.push_back(values[i++]);
    for (int r = 0; r < m_tiles * kRowsPerThreadTile; ++r)
      st.row_sum.push_back(values[i++]);
    return st;
  }
};

using Tile = std::vector<std::array<Value, kFragment>>; // S / P fragments [m][n]

// Q's A fragments: [k step][m tile] (QFragments of kernels/decode/softmax.cuh).
constexpr int kARegisters = 4; // b32 registers per thread of an m16n8k16 A fragment
using AFragment = std::array<Value, kARegisters>;
using QFragments = std::vector<std::vector<AFragment>>;

// kHoldQ of kernels/decode/softmax.cuh: Q's fragments stay in registers for the whole piece (loaded once,
// before the key loop) when they take at most kMaxHeldQRegisters, i.e. head dims up to 128 (the
// template says why: perf-notes runs 17a-b). Mirrors the template's constant (keep them equal);
// both decide from the same plan constants, kHeadDimQKMma and kMTiles.
constexpr int kMaxHeldQRegisters = 32;
bool hold_q(const Shape &sh) {
  return sh.k_steps_qk() * sh.m_tiles * kARegisters <= kMaxHeldQRegisters;
}

// load_q_fragments of kernels/decode/softmax.cuh: Q's A fragments of k step ks, matrices (rows 0-7 | 8-15) x
// (k 0-7 | 8-15), row-half first.
std::vector<AFragment> load_q_fragments(Emitter &e, const Shape &sh, Value q_smem, int ks) {
  Value lane = e.lane_id();
  Value matrix = e.div_s(lane, e.c_i32(kHalfTile)), row8 = e.rem_s(lane, e.c_i32(kHalfTile));
  Value row_half = e.mul(e.rem_s(matrix, e.c_i32(2)), e.c_i32(kHalfTile));
  Value col_half = e.mul(e.div_s(matrix, e.c_i32(2)), e.c_i32(kHalfTile));
  Value a_lane = e.add(e.mul(e.add(row_half, row8), e.c_i32(sh.smem_row_qk)), col_half);
  std::vector<AFragment> a(sh.m_tiles);
  for (int m = 0; m < sh.m_tiles; ++m)
    a[m] = e.ldmatrix_x4(
        e.gep(q_smem, e.b.getI16Type(), e.add(a_lane, e.c_i32(m * kMmaM * sh.smem_row_qk + ks * kMmaK))), false);
  return a;
}

// Every k step's fragments: the held form, loaded once per piece.
QFragments load_all_q_fragments(Emitter &e, const Shape &sh, Value q_smem) {
  QFragments q(sh.k_steps_qk());
  for (int ks = 0; ks < sh.k_steps_qk(); ++ks)
    q[ks] = load_q_fragments(e, sh, q_smem, ks);
  return q;
}

// qk_gemm: S = Q K^T for this warp's kWarpN keys of the K tile at `k_stage`; `q_fragments(ks)` gives
// Q's A fragments of k step ks (held values, or ldmatrix from shared memory right there).
template <typename QFragmentSource>
Tile qk_gemm(Emitter &e, const Shape &sh, DType dtype, Value k_stage, QFragmentSource &&q_fragments) {
  Value lane = e.lane_id();
  Value matrix = e.div_s(lane, e.c_i32(kHalfTile)), row8 = e.rem_s(lane, e.c_i32(kHalfTile));
  Value k_warp = e.gep(k_stage, e.b.getI16Type(), e.mul(e.warp_id(), e.c_i32(sh.warp_n * sh.smem_row_qk)));
  // lane part of the B ldmatrix addresses (elements): keys by matrix / 2, k by matrix % 2
  Value half_lo = e.mul(e.rem_s(matrix, e.c_i32(2)), e.c_i32(kHalfTile));
  Value half_hi = e.mul(e.div_s(matrix, e.c_i32(2)), e.c_i32(kHalfTile));
  Value b_lane = e.add(e.mul(e.add(half_hi, row8), e.c_i32(sh.smem_row_qk)), half_lo);
  const int n_tiles = sh.n_tiles_s();
  Value zero = e.c_f32(0.f);
  Tile s(sh.m_tiles * n_tiles, {zero, zero, zero, zero});
  for (int ks = 0; ks < sh.k_steps_qk(); ++ks) {
    const std::vector<AFragment> a = q_fragments(ks);
    for (int np = 0; np < n_tiles / 2; ++np) {
      auto b = e.ldmatrix_x4(
          e.gep(k_warp, e.b.getI16Type(), e.add(b_lane, e.c_i32(np * 2 * kMmaN * sh.smem_row_qk + ks * kMmaK))), false);
      for (int m = 0; m < sh.m_tiles; ++m) {
        s[m * n_tiles + 2 * np] = e.mma_m16n8k16(dtype, a[m], {b[0], b[1]}, s[m * n_tiles + 2 * np]);
        s[m * n_tiles + 2 * np + 1] = e.mma_m16n8k16(dtype, a[m], {b[2], b[3]}, s[m * n_tiles + 2 * np + 1]);
      }
    }
  }
  return s;
}

// pv_gemm: O += P V for this warp's keys; P's C fragments repacked into A fragments.
void pv_gemm(Emitter &e, const Shape &sh, DType dtype, Value v_stage, const Tile &p, WarpState &st) {
  Value lane = e.lane_id();
  Value matrix = e.div_s(lane, e.c_i32(kHalfTile)), row8 = e.rem_s(lane, e.c_i32(kHalfTile));
  Value v_warp = e.gep(v_stage, e.b.getI16Type(), e.mul(e.warp_id(), e.c_i32(sh.warp_n * sh.smem_row_v)));
  Value key_half = e.mul(e.rem_s(matrix, e.c_i32(2)), e.c_i32(kHalfTile));
  Value col_half = e.mul(e.div_s(matrix, e.c_i32(2)), e.c_i32(kHalfTile));
  Value b_lane = e.add(e.mul(e.add(key_half, row8), e.c_i32(sh.smem_row_v)), col_half);
  const int n_s = sh.n_tiles_s();
  for (int ks = 0; ks < sh.k_steps_pv(); ++ks) {
    std::vector<std::array<Value, 4>> a(sh.m_tiles);
    for (int m = 0; m < sh.m_tiles; ++m) {
      const auto &lo = p[m * n_s + 2 * ks], &hi = p[m * n_s + 2 * ks + 1];
      a[m] = {e.pack2_from_f32(dtype, lo[0], lo[1]), e.pack2_from_f32(dtype, lo[2], lo[3]),
              e.pack2_from_f32(dtype, hi[0], hi[1]), e.pack2_from_f32(dtype, hi[2], hi[3])};
    }
    for (int np = 0; np < sh.n_tiles_o() / 2; ++np) {
      auto b = e.ldmatrix_x4(
          e.gep(v_warp, e.b.getI16Type(), e.add(b_lane, e.c_i32(ks * kMmaK * sh.smem_row_v + np * 2 * kMmaN))), true);
      for (int m = 0; m < sh.m_tiles; ++m) {
        st.acc(m, 2 * np) = e.mma_m16n8k16(dtype, a[m], {b[0], b[1]}, st.acc(m, 2 * np));
        st.acc(m, 2 * np + 1) = e.mma_m16n8k16(dtype, a[m], {b[2], b[3]}, st.acc(m, 2 * np + 1));
      }
    }
    if (sh.n_tiles_o() % 2 == 1) { // head_dim_v = 8 mod 16: one n8 tile left, lanes 0-15 address
      const int last = sh.n_tiles_o() - 1;
      Value x2_lane = e.mul(e.add(key_half, row8), e.c_i32(sh.smem_row_v));
      auto b = ldmatrix_x2(
          e, e.gep(v_warp, e.b.getI16Type(), e.add(x2_lane, e.c_i32(ks * kMmaK * sh.smem_row_v + last * kMmaN))), true);
      for (int m = 0; m < sh.m_tiles; ++m)
        st.acc(m, last) = e.mma_m16n8k16(dtype, a[m], b, st.acc(m, last));
    }
  }
}

// tanh through 2^x (tanh_accurate of kernels/decode/softmax.cuh): 1 - 2 / (e^{2|y|} + 1).
Value tanh_accurate(Emitter &e, Value y) {
  Value negative = e.cmpf(arith::CmpFPredicate::OLT, y, e.c_f32(0.f));
  Value a = e.select(negative, e.fneg(y), y);
  Value t =
      e.fsub(e.c_f32(1.f),
             e.fmul(e.c_f32(2.f), e.rcp_approx(e.fadd(e.ex2_approx(e.fmul(a, e.c_f32(2.f * kLog2e))), e.c_f32(1.f)))));
  return e.select(negative, e.fneg(t), t);
}

struct RowRange {
  Value lo, hi;
};

// online_softmax: masks and scales S into base-2 logits, updates max/sum, rescales O; S becomes P.
void online_softmax(Emitter &e, const Shape &sh, const Params &p, Tile &s, const std::vector<RowRange> &ranges,
                    Value tile_key, WarpState &st) {
  Value lane = e.lane_id();
  Value quad_col = e.mul(e.rem_s(lane, e.c_i32(kQuadSize)), e.c_i32(2));
  Value warp_key = e.add(tile_key, e.mul(e.warp_id(), e.c_i32(sh.warp_n)));
  Value neg_inf = e.neg_inf();
  const int n_s = sh.n_tiles_s();
  for (int m = 0; m < sh.m_tiles; ++m)
    for (int h = 0; h < kRowsPerThreadTile; ++h) {
      const RowRange &range = ranges[m * kRowsPerThreadTile + h];
      Value tile_max = neg_inf;
      for (int n = 0; n < n_s; ++n)
        for (int i = 0; i < 2; ++i) {
          Value x = s[m * n_s + n][2 * h + i];
          if (sh.softcap)
            x = e.fmul(tanh_accurate(e, e.fmul(e.fmul(x, p.scale), p.softcap_inv)), e.fmul(p.softcap, e.c_f32(kLog2e)));
          else
            x = e.fmul(x, p.scale_log2);
          Value key = e.add(warp_key, e.add(quad_col, e.c_i32(n * kMmaN + i)));
          Value inside = e.and_(e.cmp(Pred::sge, key, range.lo), e.cmp(Pred::slt, key, range.hi));
          x = e.select(inside, x, neg_inf);
          s[m * n_s + n][2 * h + i] = x;
          tile_max = e.max_f32(tile_max, x);
        }
      tile_max = e.quad_reduce_max(tile_max);
      Value &row_max = st.row_max[m * kRowsPerThreadTile + h];
      Value new_max = e.max_f32(row_max, tile_max);
      // a row that has seen no key keeps max = -inf; subtract 0 so that -inf - -inf never occurs
      Value shift = e.select(e.cmpf(arith::CmpFPredicate::OEQ, new_max, neg_inf), e.c_f32(0.f), new_max);
      Value correction = e.ex2_approx(e.fsub(row_max, shift));
      row_max = new_max;
      Value sum = e.c_f32(0.f);
      for (int n = 0; n < n_s; ++n)
        for (int i = 0; i < 2; ++i) {
          Value prob = e.ex2_approx(e.fsub(s[m * n_s + n][2 * h + i], shift));
          s[m * n_s + n][2 * h + i] = prob;
          sum = e.fadd(sum, prob);
        }
      Value &row_sum = st.row_sum[m * kRowsPerThreadTile + h];
      row_sum = e.fadd(e.fmul(row_sum, correction), sum);
      for (int n = 0; n < sh.n_tiles_o(); ++n) {
        st.acc(m, n)[2 * h] = e.fmul(st.acc(m, n)[2 * h], correction);
        st.acc(m, n)[2 * h + 1] = e.fmul(st.acc(m, n)[2 * h + 1], correction);
      }
    }
}

// merge_unit of kernels/decode/merge.cuh: the partial states of the split unit `merge` (an fj_decode_merge
// as four i32) into O and LSE, warp w of `warps` taking packed rows w, w + warps, ... `coherent`:
// the states were written by other CTAs of this grid (the fused merge).
void merge_unit(Emitter &e, const Shape &sh, const Params &p, Value m, int warps, bool coherent) {
  Unit u = decode_unit(e, sh, p, e.extract(m, 0), /*with_kv_len=*/false);
  Value first_state = e.extract(m, 1), count = e.extract(m, 2);
  const int64_t state_o = int64_t(sh.block_m) * sh.head_dim_v;
  const RowMerge merge{sh.dtype, sh.head_dim_v, sh.aligned16, coherent};
  scf::ForOp::create(
      e.b, e.loc, e.warp_id(), u.rows_here, e.c_i32(warps), ValueRange{},
      [&](mlir::OpBuilder &, mlir::Location, Value row, ValueRange) {
        Value packed = e.add(e.mul(u.m_block, e.c_i32(sh.block_m)), row);
        Value token = e.div_s(packed, e.c_i32(sh.gqa_group));
        Value head = e.add(e.mul(u.head_kv, e.c_i32(sh.gqa_group)), e.rem_s(packed, e.c_i32(sh.gqa_group)));
        Value offset = e.add(e.add(e.mul(e.sext64(u.batch), p.o_strides[0]), e.mul(e.sext64(token), p.o_strides[1])),
                             e.mul(e.sext64(head), p.o_strides[2]));
        Value dst = e.gep(p.o, e.b.getI16Type(), offset);
        Value lse_index =
            e.add(e.mul(e.add(e.mul(e.sext64(u.batch), e.sext64(p.heads_q)), e.sext64(head)), e.sext64(p.seqlen_q)),
                  e.sext64(token));
        Value row64 = e.sext64(row);
        Value o_states =
            e.gep(p.partial_o, e.f32(),
                  e.add(e.mul(e.sext64(first_state), e.c_i64(state_o)), e.mul(row64, e.c_i64(sh.head_dim_v))));
        Value lse_states =
            e.gep(p.partial_lse, e.f32(), e.add(e.mul(e.sext64(first_state), e.c_i64(sh.block_m)), row64));
        merge_states_row(e, merge, o_states, e.c_i64(state_o), lse_states, e.c_i64(sh.block_m), count, dst, p.maybe_lse,
                         lse_index);
        scf::YieldOp::create(e.b, e.loc);
      });
}

// The fused merge's PTX (prim/atomic.cuh).
// fence.acq_rel.gpu
void fence_acq_rel_gpu(Emitter &e) {
  e.asm_void({}, "fence.acq_rel.gpu;", "~{memory}");
}
// atom.acq_rel.gpu.global.add.s32 d, [a], b — d receives the value before the add
Value atom_add_acq_rel_gpu_s32(Emitter &e, Value address, Value value) {
  return e.asm_value(e.i32(), {e.to_global(address), value}, "atom.acq_rel.gpu.global.add.s32 $0, [$1], $2;",
                     "=r,l,r,~{memory}");
}
// st.relaxed.gpu.global.s32 [a], b
void st_relaxed_gpu_s32(Emitter &e, Value address, Value value) {
  e.asm_void({e.to_global(address), value}, "st.relaxed.gpu.global.s32 [$0], $1;", "l,r,~{memory}");
}
// bar.red.or.pred p, 0, q — a CTA barrier that tells every thread whether any thread's predicate held
Value bar_red_or(Emitter &e, Value predicate) {
  Value word = mlir::LLVM::ZExtOp::create(e.b, e.loc, e.i32(), predicate);
  Value any =
      e.asm_value(e.i32(), {word},
                  "{\n\t.reg .pred p, q;\n\tsetp.ne.u32 p, $1, 0;\n\tbar.red.or.pred q, 0, p;\n\tselp.u32 $0, 1, "
                  "0, q;\n}",
                  "=r,r,~{memory}");
  return e.cmp(Pred::ne, any, e.c_i32(0));
}

// The fused merge's arrays after merges[grid] (params_decode.h), as i32 pointers.
Value merge_list(Emitter &e, const Params &p) {
  return param_at(e, p.block, p.block_type, {kMerges});
}
// mov.u32 d, %nctaid.x, as volatile asm: the addresses made from it stay where they are used (LLVM
// would hoist nvvm's grid-size read, and those addresses, out of the piece loop into registers
// live across the key loop: +4 registers, measured on sm_80 d72).
Value grid_size_here(Emitter &e) {
  return e.asm_value(e.i32(), {}, "mov.u32 $0, %nctaid.x;", "=r");
}
Value state_merge_array(Emitter &e, const Params &p) {
  return e.gep(merge_list(e, p), e.i32(), e.mul(e.sext64(grid_size_here(e)), e.c_i64(kWorkFields)));
}
Value merge_counter_array(Emitter &e, const Params &p) {
  constexpr int kRound = fj_decode_i32_per_16_bytes;
  Value states = e.mul(grid_size_here(e), e.c_i32(fj_decode_states_per_cta));
  Value padded = e.mul(e.div_s(e.add(states, e.c_i32(kRound - 1)), e.c_i32(kRound)), e.c_i32(kRound));
  return e.gep(state_merge_array(e, p), e.i32(), e.sext64(padded));
}
Value load_merge(Emitter &e, const Params &p, Value index) {
  return e.ld_global_nc_v4_s32(e.gep(merge_list(e, p), e.i32(), e.mul(e.sext64(index), e.c_i64(kWorkFields))));
}

// arrive_and_maybe_merge of kernels/decode/merge.cuh: every thread, once partial state `state` is written.
// The barrier orders the CTA's state stores before thread 0's release on the merge's counter; the
// arrival that completes the count acquires, merges the unit and puts the counter back to zero.
void arrive_and_maybe_merge(Emitter &e, const Shape &sh, const Params &p, Value state) {
  e.bar_sync(); // every thread's partial-state stores, before thread 0's release
  Value last = if_values(
      e, e.cmp(Pred::eq, e.tid_x(), e.c_i32(0)), mlir::TypeRange{e.i1()},
      [&] {
        Value m = e.ld_global_nc_s32(e.gep(state_merge_array(e, p), e.i32(), e.sext64(state)));
        Value merge = load_merge(e, p, m);
        Value counter = e.gep(merge_counter_array(e, p), e.i32(), e.sext64(m));
        fence_acq_rel_gpu(e);
        Value old = atom_add_acq_rel_gpu_s32(e, counter, e.c_i32(1));
        Value is_last = e.cmp(Pred::eq, old, e.sub(e.extract(merge, 2), e.c_i32(1)));
        when(e, is_last, [&] { st_relaxed_gpu_s32(e, counter, e.c_i32(0)); });
        return llvm::SmallVector<Value, 1>{is_last};
      },
      [&] { return llvm::SmallVector<Value, 1>{arith::ConstantIntOp::create(e.b, e.loc, e.i1(), 0)}; })[0];
  when(e, bar_red_or(e, last), [&] { // uniform: thread 0's decision, to every thread
    // acquire for every thread: the states, after thread 0's acquire and the barrier
    fence_acq_rel_gpu(e);
    Value m = e.ld_global_nc_s32(e.gep(state_merge_array(e, p), e.i32(), e.sext64(state)));
    merge_unit(e, sh, p, load_merge(e, p, m), sh.warps(), /*coherent=*/true);
  });
}

// finish_piece: merge the warps through shared memory, write O (or a partial state) and the LSE.
void finish_piece(Emitter &e, const Shape &sh, const Params &p, const Unit &u, const Smem &smem, WarpState &st) {
  mlir::Type f32 = e.f32(), v2f32 = mlir::VectorType::get({2}, f32);
  Value lane = e.lane_id(), warp = e.warp_id();
  Value group_row = e.div_s(lane, e.c_i32(kQuadSize));
  Value quad_col = e.mul(e.rem_s(lane, e.c_i32(kQuadSize)), e.c_i32(2));
  Value stats = smem.stats(), merge = smem.merge();
  Value warp_rows = e.mul(warp, e.c_i32(sh.block_m));
  Value warp_merge = e.gep(merge, f32, e.mul(warp_rows, e.c_i32(sh.merge_row_floats)));
  Value first_lane = e.cmp(Pred::eq, e.rem_s(lane, e.c_i32(kQuadSize)), e.c_i32(0));

  e.bar_sync(); // every warp is done reading the ring, which `merge` aliases
  for (int m = 0; m < sh.m_tiles; ++m)
    for (int h = 0; h < kRowsPerThreadTile; ++h) {
      Value row = e.add(group_row, e.c_i32(m * kMmaM + h * kHalfTile));
      Value sum = e.quad_reduce_sum(st.row_sum[m * kRowsPerThreadTile + h]);
      Value max = st.row_max[m * kRowsPerThreadTile + h];
      when(e, first_lane, [&] {
        Value slot = e.gep(stats, f32, e.mul(e.add(warp_rows, row), e.c_i32(kStatsPerRow)));
        e.st_shared(slot, max, kF32Bytes);
        e.st_shared(e.gep(slot, f32, e.c_i32(1)), sum, kF32Bytes);
      });
      for (int n = 0; n < sh.n_tiles_o(); ++n) {
        Value dst = e.gep(warp_merge, f32,
                          e.add(e.mul(row, e.c_i32(sh.merge_row_floats)), e.add(quad_col, e.c_i32(n * kMmaN))));
        Value pair = mlir::vector::FromElementsOp::create(e.b, e.loc, v2f32,
                                                          ValueRange{st.acc(m, n)[2 * h], st.acc(m, n)[2 * h + 1]});
        e.st_shared(dst, pair, 2 * kF32Bytes);
      }
    }
  e.bar_sync();

  // Threads sweep (row, 8-column chunk) pairs; each recomputes its row's warp weights.
  const int chunks_per_row = sh.head_dim_v / kMergeChunk;
  Value neg_inf = e.neg_inf(), zero = e.c_f32(0.f);
  scf::ForOp::create(
      e.b, e.loc, e.tid_x(), e.mul(u.rows_here, e.c_i32(chunks_per_row)), e.c_i32(sh.threads), ValueRange{},
      [&](mlir::OpBuilder &, mlir::Location, Value c, ValueRange) {
        Value row = e.div_s(c, e.c_i32(chunks_per_row));
        Value col = e.mul(e.rem_s(c, e.c_i32(chunks_per_row)), e.c_i32(kMergeChunk));
        std::vector<Value> wmax(sh.warps()), wsum(sh.warps());
        Value max_all = neg_inf;
        for (int w = 0; w < sh.warps(); ++w) {
          Value slot = e.gep(stats, f32, e.mul(e.add(row, e.c_i32(w * sh.block_m)), e.c_i32(kStatsPerRow)));
          wmax[w] = e.ld_shared(f32, slot, kF32Bytes);
          wsum[w] = e.ld_shared(f32, e.gep(slot, f32, e.c_i32(1)), kF32Bytes);
          max_all = e.max_f32(max_all, wmax[w]);
        }
        Value empty = e.cmpf(arith::CmpFPredicate::OEQ, max_all, neg_inf);
        std::vector<Value> weight(sh.warps());
        Value total = zero;
        for (int w = 0; w < sh.warps(); ++w) {
          weight[w] = e.select(empty, zero, e.ex2_approx(e.fsub(wmax[w], max_all)));
          total = e.fadd(total, e.fmul(weight[w], wsum[w]));
        }
        Value positive = e.cmpf(arith::CmpFPredicate::OGT, total, zero);
        Value inv_total = e.select(positive, e.rcp_approx(total), zero);
        std::vector<Value> out(kMergeChunk, zero);
        for (int w = 0; w < sh.warps(); ++w) {
          Value src =
              e.gep(merge, f32, e.add(e.mul(e.add(row, e.c_i32(w * sh.block_m)), e.c_i32(sh.merge_row_floats)), col));
          for (int half = 0; half < kMergeChunk / kVec4; ++half) {
            Value v = e.ld_shared(e.v4f32(), e.gep(src, f32, e.c_i32(half * kVec4)), kVec4 * kF32Bytes);
            for (int i = 0; i < kVec4; ++i)
              out[half * kVec4 + i] = e.fadd(out[half * kVec4 + i], e.fmul(weight[w], e.extract(v, i)));
          }
        }
        for (Value &x : out)
          x = e.fmul(x, inv_total);
        Value lse = e.select(positive, e.fmul(e.fadd(max_all, e.lg2_approx(total)), e.c_f32(kLn2)), neg_inf);
        Value packed = e.add(e.mul(u.m_block, e.c_i32(sh.block_m)), row);
        Value direct = e.cmp(Pred::slt, u.state, e.c_i32(0));
        auto branch = scf::IfOp::create(e.b, e.loc, direct, /*withElseRegion=*/true);
        {
          mlir::OpBuilder::InsertionGuard guard(e.b);
          e.b.setInsertionPoint(branch.thenBlock()->getTerminator());
          Value token = e.div_s(packed, e.c_i32(sh.gqa_group));
          Value head = e.add(e.mul(u.head_kv, e.c_i32(sh.gqa_group)), e.rem_s(packed, e.c_i32(sh.gqa_group)));
          Value offset = e.add(e.add(e.mul(e.sext64(u.batch), p.o_strides[0]), e.mul(e.sext64(token), p.o_strides[1])),
                               e.add(e.mul(e.sext64(head), p.o_strides[2]), e.sext64(col)));
          Value dst = e.gep(p.o, e.b.getI16Type(), offset);
          if (sh.aligned16) { // store_16bit: one 16-byte store, or eight 16-bit ones
            llvm::SmallVector<Value, 4> words;
            for (int i = 0; i < kMergeChunk; i += 2)
              words.push_back(e.pack2_from_f32(sh.dtype, out[i], out[i + 1]));
            e.st_global_v4(
                dst, mlir::vector::FromElementsOp::create(e.b, e.loc, mlir::VectorType::get({kVec4}, e.i32()), words));
          } else {
            for (int i = 0; i < kMergeChunk; ++i)
              e.st_global_b16(e.gep(dst, e.b.getI16Type(), e.c_i32(i)), e.cvt_rn_16_f32(sh.dtype, out[i]));
          }
          when(e, e.and_(e.not_(e.is_null(p.maybe_lse)), e.cmp(Pred::eq, col, e.c_i32(0))), [&] {
            Value index =
                e.add(e.mul(e.add(e.mul(e.sext64(u.batch), e.sext64(p.heads_q)), e.sext64(head)), e.sext64(p.seqlen_q)),
                      e.sext64(token));
            e.st_global_f32(e.gep(p.maybe_lse, f32, index), lse);
          });
          e.b.setInsertionPoint(branch.elseBlock()->getTerminator());
          Value state_row = e.add(e.mul(e.sext64(u.state), e.c_i64(sh.block_m)), e.sext64(row));
          Value dst_o = e.gep(p.partial_o, f32, e.add(e.mul(state_row, e.c_i64(sh.head_dim_v)), e.sext64(col)));
          for (int half = 0; half < kMergeChunk / kVec4; ++half) {
            Value v = mlir::vector::FromElementsOp::create(
                e.b, e.loc, e.v4f32(),
                ValueRange{out[half * kVec4], out[half * kVec4 + 1], out[half * kVec4 + 2], out[half * kVec4 + 3]});
            e.st_global_v4(e.gep(dst_o, f32, e.c_i32(half * kVec4)), v);
          }
          when(e, e.cmp(Pred::eq, col, e.c_i32(0)),
               [&] { e.st_global_f32(e.gep(p.partial_lse, f32, state_row), lse); });
        }
        scf::YieldOp::create(e.b, e.loc);
      });
  if (sh.fused_merge != 0)
    when(e, e.cmp(Pred::sge, u.state, e.c_i32(0)), [&] { arrive_and_maybe_merge(e, sh, p, u.state); }); // uniform
  e.bar_sync(); // the next piece's copies overwrite `merge` and `stats`
}

// run_piece: keys [kv_begin, kv_end) of one unit.
void run_piece(Emitter &e, const Shape &sh, const Params &p, const Unit &u, const Smem &smem) {
  mlir::Type i16 = e.b.getI16Type();
  // kv_source: paged KV has no batch stride (the block table picks the pages)
  KvSource src;
  Value k_head = e.mul(e.sext64(u.head_kv), p.k_strides[2]), v_head = e.mul(e.sext64(u.head_kv), p.v_strides[2]);
  src.k = e.gep(p.k, i16, sh.paged() ? k_head : e.add(e.mul(e.sext64(u.batch), p.k_strides[0]), k_head));
  src.v = e.gep(p.v, i16, sh.paged() ? v_head : e.add(e.mul(e.sext64(u.batch), p.v_strides[0]), v_head));
  src.k_row = p.k_strides[1];
  src.v_row = p.v_strides[1];
  src.k_page = p.page_stride_k;
  src.v_page = p.page_stride_v;
  if (sh.paged())
    src.table = e.gep(p.block_table, e.i32(), e.mul(e.sext64(u.batch), e.sext64(p.max_pages_per_seq)));
  src.kv_begin = u.kv_begin;
  src.kv_end = u.kv_end;
  src.policy = sh.kv_l2_hints != 0 ? e.l2_policy(/*evict_last=*/false) : e.c_i64(0);
  zero_qk_padding(e, sh, smem); // the previous piece's merge scratch may have covered the K padding
  Value num_tiles = e.div_s(e.add(e.sub(u.kv_end, u.kv_begin), e.c_i32(sh.block_n - 1)), e.c_i32(sh.block_n));

  // Paged: pages of tiles 0 .. kStages-1 (their lookups go out together) before any copy reads them.
  if (sh.paged()) {
    std::vector<Value> first_pages;
    for (int t = 0; t < sh.stages; ++t)
      first_pages.push_back(lookup_page(e, sh, src, e.c_i32(t)));
    for (int t = 0; t < sh.stages; ++t)
      store_pages(e, sh, smem, e.c_i32(t), first_pages[t]);
    e.bar_sync();
  }

  // load_q: rows past the real ones are zero-filled (they never reach HBM)
  {
    const int chunks_qk = sh.head_dim_qk / kChunkElems;
    scf::ForOp::create(
        e.b, e.loc, e.tid_x(), e.c_i32(sh.block_m * chunks_qk), e.c_i32(sh.threads), ValueRange{},
        [&](mlir::OpBuilder &, mlir::Location, Value c, ValueRange) {
          Value r = e.div_s(c, e.c_i32(chunks_qk));
          Value col = e.mul(e.rem_s(c, e.c_i32(chunks_qk)), e.c_i32(kChunkElems));
          Value row = e.add(e.mul(u.m_block, e.c_i32(sh.block_m)), r);
          Value valid = e.cmp(Pred::slt, r, u.rows_here);
          Value token = e.div_s(row, e.c_i32(sh.gqa_group));
          Value head = e.add(e.mul(u.head_kv, e.c_i32(sh.gqa_group)), e.rem_s(row, e.c_i32(sh.gqa_group)));
          Value offset = e.add(e.add(e.mul(e.sext64(u.batch), p.q_strides[0]), e.mul(e.sext64(token), p.q_strides[1])),
                               e.add(e.mul(e.sext64(head), p.q_strides[2]), e.sext64(col)));
          Value dst = e.gep(smem.q(), i16, e.add(e.mul(r, e.c_i32(sh.smem_row_qk)), col));
          copy_chunk(e, sh, dst, valid, p.q, [&] { return e.gep(p.q, i16, offset); });
          scf::YieldOp::create(e.b, e.loc);
        });
  }
  // prologue: the first kStages - 1 tiles, one commit group per tile, empty or not
  for (int t = 0; t < sh.stages - 1; ++t) {
    when(e, e.cmp(Pred::slt, e.c_i32(t), num_tiles), [&] { issue_tile(e, sh, smem, src, e.c_i32(t)); });
    e.cp_async_commit_group();
  }
  // stored at step 0, read by the copies at step 1
  Value next_page = sh.paged() ? lookup_page(e, sh, src, e.c_i32(sh.stages)) : Value{};

  // row_range per (m tile, half): causal and window aligned to the end of the sequence
  std::vector<RowRange> ranges;
  Value group_row = e.div_s(e.lane_id(), e.c_i32(kQuadSize));
  for (int m = 0; m < sh.m_tiles; ++m)
    for (int h = 0; h < kRowsPerThreadTile; ++h) {
      Value row_in_block = e.add(group_row, e.c_i32(m * kMmaM + h * kHalfTile));
      Value token = e.div_s(e.add(e.mul(u.m_block, e.c_i32(sh.block_m)), row_in_block), e.c_i32(sh.gqa_group));
      Value diag = e.sub(e.add(token, u.kv_len), p.seqlen_q);
      Value diag_next = e.add(diag, e.c_i32(1));
      RowRange r{u.kv_begin, u.kv_end};
      if (sh.causal)
        r.hi = e.min_s(r.hi, diag_next);
      if (sh.local) {
        r.lo = e.select(e.cmp(Pred::sge, p.window_left, e.c_i32(0)), e.max_s(r.lo, e.sub(diag, p.window_left)), r.lo);
        r.hi = e.select(e.cmp(Pred::sge, p.window_right, e.c_i32(0)), e.min_s(r.hi, e.add(diag_next, p.window_right)),
                        r.hi);
      }
      ranges.push_back(r);
    }

  WarpState init{{}, {}, {}, sh.m_tiles, sh.n_tiles_o()};
  Value zero = e.c_f32(0.f), neg_inf = e.neg_inf();
  init.o.assign(sh.m_tiles * sh.n_tiles_o(), {zero, zero, zero, zero});
  init.row_max.assign(sh.m_tiles * kRowsPerThreadTile, neg_inf);
  init.row_sum.assign(sh.m_tiles * kRowsPerThreadTile, zero);
  std::vector<Value> carried = init.flatten();
  if (sh.paged())
    carried.push_back(next_page); // the lookup one step ahead of its slot

  // kHoldQ: Q's fragments of every k step, loaded once per piece; every tile's QK GEMM takes them
  // as loop-invariant values. Q's copies went out with tile 0's group. The template loads the
  // fragments in the loop's first step, after that step's wait and barrier; here the same wait and
  // one more barrier per piece come before the loop (whose first wait then returns at once).
  QFragments q_held;
  if (hold_q(sh)) {
    e.cp_async_wait_group(sh.stages - 2); // Q (and tile 0) has landed for this thread
    e.bar_sync();                         // ... and for every thread
    q_held = load_all_q_fragments(e, sh, smem.q());
  }
  auto loop = scf::ForOp::create(
      e.b, e.loc, e.c_i32(0), num_tiles, e.c_i32(1), carried,
      [&](mlir::OpBuilder &, mlir::Location, Value t, ValueRange values) {
        WarpState st = WarpState::from(values, sh.m_tiles, sh.n_tiles_o());
        e.cp_async_wait_group(sh.stages - 2); // tile t (and Q) has landed for this thread
        e.bar_sync();                         // ... and for every thread; stage t-1 is free again
        Value ahead = e.add(t, e.c_i32(sh.stages - 1));
        when(e, e.cmp(Pred::slt, ahead, num_tiles), [&] { issue_tile(e, sh, smem, src, ahead); });
        e.cp_async_commit_group();
        Value page = sh.paged() ? values.back() : Value{};
        if (sh.paged()) {
          // slot (t + kStages) % kStages is tile t's, whose copies went out kStages - 1
          // steps ago
          Value after = e.add(ahead, e.c_i32(1));
          page = if_values(
              e, e.cmp(Pred::slt, after, num_tiles), mlir::TypeRange{e.i32()},
              [&] {
                store_pages(e, sh, smem, after, page);
                return llvm::SmallVector<Value, 1>{lookup_page(e, sh, src, e.add(ahead, e.c_i32(2)))};
              },
              [&] { return llvm::SmallVector<Value, 1>{page}; })[0];
        }
        Value stage = e.rem_s(t, e.c_i32(sh.stages));
        Value tile_key = e.add(u.kv_begin, e.mul(t, e.c_i32(sh.block_n)));
        Tile s = qk_gemm(e, sh, sh.dtype, smem.k(stage),
                         [&](int ks) { return hold_q(sh) ? q_held[ks] : load_q_fragments(e, sh, smem.q(), ks); });
        online_softmax(e, sh, p, s, ranges, tile_key, st);
        pv_gemm(e, sh, sh.dtype, smem.v(stage), s, st);
        std::vector<Value> next = st.flatten();
        if (sh.paged())
          next.push_back(page);
        scf::YieldOp::create(e.b, e.loc, next);
      });
  e.cp_async_wait_group(0); // only empty groups remain, or Q when the piece has no tile
  WarpState st = WarpState::from(loop.getResults(), sh.m_tiles, sh.n_tiles_o());
  finish_piece(e, sh, p, u, smem, st);
}

} // namespace

// Every spec decode_splitk.cuh compiles is covered; this only mirrors its 16-byte-chunk rule (the
// planner refuses such dims first).
std::string decode_unsupported_reason(const KernelSpec &spec) {
  if (spec.head_dim_qk % kChunkElems != 0 || spec.head_dim_v % kChunkElems != 0)
    return "head dims that are not multiples of 8 (" + std::to_string(spec.head_dim_qk) + "/" +
           std::to_string(spec.head_dim_v) + ")";
  return "";
}

Status build_decode(mlir::gpu::GPUModuleOp module, const KernelSpec &spec, const Plan &plan,
                    std::vector<BuiltKernel> *out) {
  if (std::string why = decode_unsupported_reason(spec); !why.empty())
    return Status::error(FLASHJIT_UNSUPPORTED, "decode (MLIR): " + why);
  Shape sh{};
  sh.dtype = spec.dtype == FLASHJIT_FP16 ? DType::fp16 : DType::bf16;
  sh.arch = spec.arch.sm;
  sh.head_dim_qk = spec.head_dim_qk;
  sh.head_dim_v = spec.head_dim_v;
  sh.gqa_group = spec.gqa_group;
  sh.threads = plan.threads;
  sh.causal = spec.causal;
  sh.local = spec.local;
  sh.softcap = spec.softcap;
  sh.page_size = spec.page_size;
  sh.aligned16 = spec.align_bytes >= kChunkBytes;
  if (Status s = read_plan<int>("decode", plan,
                                {
                                    {"kBlockM", &sh.block_m},
                                    {"kBlockN", &sh.block_n},
                                    {"kWarpN", &sh.warp_n},
                                    {"kStages", &sh.stages},
                                    {"kMTiles", &sh.m_tiles},
                                    {"kCtasPerSm", &sh.ctas_per_sm},
                                    {"kCombineThreads", &sh.combine_threads},
                                    {"kSmemRowQK", &sh.smem_row_qk},
                                    {"kSmemRowV", &sh.smem_row_v},
                                    {"kSmemOffsetQ", &sh.smem_offset_q},
                                    {"kSmemOffsetKV", &sh.smem_offset_kv},
                                    {"kSmemStageBytes", &sh.smem_stage_bytes},
                                    {"kSmemOffsetVInStage", &sh.smem_offset_v_in_stage},
                                    {"kSmemOffsetStats", &sh.smem_offset_stats},
                                    {"kSmemOffsetPages", &sh.smem_offset_pages},
                                    {"kHeadDimQKMma", &sh.head_dim_qk_mma},
                                    {"kMergeRowFloats", &sh.merge_row_floats},
                                    {"kKvL2Hints", &sh.kv_l2_hints},
                                    {"kFusedMerge", &sh.fused_merge},
                                });
      !s)
    return s;
  if (plan.constant("kTmaKv", 0) != 0)
    return Status::error(FLASHJIT_UNSUPPORTED, "decode (MLIR): TMA tile plans (kTmaKv) have a template form only; plan "
                                               "with the MLIR backend (FLASHJIT_BACKEND_MLIR) for cp.async tiles");
  // The static_asserts of kernels/decode/traits.cuh's Traits, as errors.
  if (sh.threads % kWarpSize != 0 || sh.block_n != sh.warp_n * sh.warps() || sh.warp_n % kMmaK != 0 ||
      sh.block_m != sh.m_tiles * kMmaM || sh.stages < 2 || sh.gqa_group < 1 ||
      sh.smem_offset_kv + sh.stages * sh.smem_stage_bytes > sh.smem_offset_stats ||
      sh.smem_offset_kv + sh.warps() * sh.block_m * sh.merge_row_floats * kF32Bytes > sh.smem_offset_stats ||
      sh.combine_threads % kWarpSize != 0 || sh.head_dim_qk % kChunkElems != 0 || sh.head_dim_v % kChunkElems != 0 ||
      sh.head_dim_qk_mma % kMmaK != 0 || sh.head_dim_qk_mma < sh.head_dim_qk ||
      // the QK padding is zeroed as one 16-byte chunk per row
      (sh.head_dim_qk_mma != sh.head_dim_qk && sh.head_dim_qk_mma - sh.head_dim_qk != kChunkElems) ||
      sh.smem_row_qk % kChunkElems != 0 || sh.smem_row_qk < sh.head_dim_qk_mma || sh.smem_row_v < sh.head_dim_v ||
      sh.smem_offset_stats + sh.warps() * sh.block_m * kStatsPerRow * kF32Bytes > sh.smem_offset_pages ||
      (sh.paged() && sh.smem_offset_pages + sh.stages * sh.block_n * kI32Bytes > plan.smem_bytes))
    return Status::error(FLASHJIT_INTERNAL, "decode: the plan's constants break the kernel's invariants");

  mlir::OpBuilder b(module.getContext());
  mlir::Location loc = b.getUnknownLoc();
  b.setInsertionPointToEnd(module.getBody());
  Emitter e{b, loc};
  mlir::LLVM::LLVMStructType params_type = decode_params_type(e);

  // extern __shared__ __align__(128) char smem_raw[]
  constexpr int kSmemAlign = 128;
  extern_shared(e, "fj_decode_smem", kSmemAlign);

  // --- fj_decode_splitk
  {
    mlir::OpBuilder::InsertionGuard guard(b);
    auto fn = kernel_func(e, "fj_decode_splitk", sh.threads);
    b.setInsertionPointToStart(&fn.getBody().front());
    Value pp = fn.getArgument(0);
    Smem smem{mlir::LLVM::AddressOfOp::create(b, loc, e.ptr(kSharedSpace), "fj_decode_smem"), e, sh};
    // The next grid of the stream (the combine, or with kFusedMerge the next step's decode) may get
    // resident now and wait (PDL).
    if (sh.arch >= 90)
      e.griddepcontrol(mlir::NVVM::GridDepActionKind::launch_dependents);
    Params p = load_params(e, pp, params_type);
    p.block = pp;
    p.block_type = params_type;
    Value slot_begin = param_at(e, pp, params_type, {kSlotBegin});
    Value work = param_at(e, pp, params_type, {kWork});
    Value cta = e.sext64(e.ctaid_x());
    Value first = e.load(e.i32(), e.to_global(e.gep(slot_begin, e.i32(), cta)), kF32Bytes);
    Value last = e.load(e.i32(), e.to_global(e.gep(slot_begin, e.i32(), e.add(cta, e.c_i64(1)))), kF32Bytes);
    auto load_work = [&](Value i) {
      return e.ld_global_nc_v4_s32(e.gep(work, e.i32(), e.mul(e.sext64(i), e.c_i64(kWorkFields))));
    };
    // A CTA without work touches no memory and need not wait (PDL). The work list is the host's: its
    // first entry is read before griddepcontrol.wait, Q/K/V/lengths/tables after; the wait is
    // conditional on the entry (kv_begin <= kv_end always) only so that the load issues before it.
    when(e, e.cmp(Pred::slt, first, last), [&] {
      Value first_work = load_work(first);
      if (sh.arch >= 90)
        when(e, e.cmp(Pred::sle, e.extract(first_work, 1), e.extract(first_work, 2)),
             [&] { e.griddepcontrol(mlir::NVVM::GridDepActionKind::wait); });
      scf::ForOp::create(b, loc, first, last, e.c_i32(1), ValueRange{},
                         [&](mlir::OpBuilder &, mlir::Location, Value i, ValueRange) {
                           Value w = if_values(
                               e, e.cmp(Pred::eq, i, first), mlir::TypeRange{first_work.getType()},
                               [&] { return llvm::SmallVector<Value, 1>{first_work}; },
                               [&] { return llvm::SmallVector<Value, 1>{load_work(i)}; })[0];
                           Unit u = decode_unit(e, sh, p, e.extract(w, 0), /*with_kv_len=*/true);
                           u.kv_begin = e.extract(w, 1);
                           u.kv_end = e.extract(w, 2);
                           u.state = e.extract(w, 3);
                           run_piece(e, sh, p, u, smem);
                           scf::YieldOp::create(b, loc);
                         });
    });
    mlir::gpu::ReturnOp::create(b, loc);
    if (Status s = layout_matches("decode", fn, params_type, int(sizeof(fj_decode_params))); !s)
      return s;
  }

  // --- fj_decode_combine: CTA x merges merges[x]; one warp per packed row
  {
    mlir::OpBuilder::InsertionGuard guard(b);
    auto fn = kernel_func(e, "fj_decode_combine", sh.combine_threads);
    b.setInsertionPointToStart(&fn.getBody().front());
    Value pp = fn.getArgument(0);
    if (sh.arch >= 90) {
      // The next step's decode (PDL) may get resident now; it waits for this grid before touching
      // anything this grid reads or writes.
      e.griddepcontrol(mlir::NVVM::GridDepActionKind::launch_dependents);
      e.griddepcontrol(mlir::NVVM::GridDepActionKind::wait); // launched with PDL: the decode's partials
    }
    const Params p = load_params(e, pp, params_type);
    Value header = param_at(e, pp, params_type, {kHeader});
    Value merges = param_at(e, pp, params_type, {kMerges});
    Value cta = e.ctaid_x();
    constexpr int kHeaderNumMerges = offsetof(fj_decode_header, num_merges) / sizeof(fj_i32);
    Value num_merges = e.load(e.i32(), e.to_global(e.gep(header, e.i32(), e.c_i32(kHeaderNumMerges))), kF32Bytes);
    when(e, e.cmp(Pred::slt, cta, num_merges), [&] {
      Value m = e.ld_global_nc_v4_s32(e.gep(merges, e.i32(), e.mul(e.sext64(cta), e.c_i64(kWorkFields))));
      merge_unit(e, sh, p, m, sh.combine_threads / kWarpSize, /*coherent=*/false);
    });
    mlir::gpu::ReturnOp::create(b, loc);
  }

  const int bytes = int(sizeof(fj_decode_params));
  out->assign(2, BuiltKernel{});
  (*out)[0] = {"fj_decode_splitk", 0, params_type, bytes, sh.ctas_per_sm};
  (*out)[1] = {"fj_decode_combine", 0, params_type, bytes, 1};
  return Status::success();
}

} // namespace flashjit::mlirgen
