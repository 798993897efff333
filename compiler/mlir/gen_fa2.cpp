// The FlashAttention-2 prefill kernel (templates/kernels/fa2_prefill.cuh) built with MLIR: one CTA
// computes kBlockM query rows of one (batch, head), each warp kRowsPerWarp of them (one or two m16
// mma.sync row blocks); key/value blocks stream through kStages shared-memory buffers filled by
// cp.async (16-byte rows: contiguous and paged K/V through the fixed per-thread KvStream pattern) or predicated element
// loads (element-aligned rows); S = Q K^T and O += P V on mma.sync m16n8k16 with ldmatrix operands, online softmax per
// warp, O staged through shared memory for 16-byte row stores. Both schedules of the template: the ring (kStages >= 2)
// and the interleaved single buffer (kStages == 1). Same plan constants, entry (fj_fa2_prefill), by-value
// fj_attention_params block and __launch_bounds__(kThreads, 1) as the NVRTC kernel, and the same arithmetic in the same
// order (where a multiply and an add fuse is left to each compiler, as NVRTC's default --fmad=true does).
//
// Covered: fp16/bf16, head dims 8..256 in steps of 8 (QK's K zero-padded to 16 in shared memory,
// an odd n8 tile of P V through ldmatrix .x2), head_dim_v != head_dim_qk, causal (bottom-right),
// sliding window, softcap, LSE, GQA, arbitrary strides, varlen (cu_seqlens), paged KV, 16-byte
// and element-aligned rows, 16 and 32 rows per warp.
#include "compiler/mlir/emit_mma.hpp"
#include "compiler/mlir/generators.hpp"

#include <string>
#include <vector>

namespace flashjit::mlirgen {
namespace {

using mlir::Value;
using mlir::ValueRange;
namespace arith = mlir::arith;
namespace scf = mlir::scf;
using Pred = arith::CmpIPredicate;
using FPred = arith::CmpFPredicate;
using Frag = std::array<Value, kFragment>;

constexpr int kRowsPerFragment = 2; // rows g and g + 8 of an m16 C fragment, per thread
constexpr int kMaxMBlocks = 2;      // m16 row blocks per warp: 16 or 32 rows
constexpr int kWordsPerChunk = kChunkBytes / kF32Bytes;

// KernelConfig of the NVRTC build: the spec's switches plus the plan's constants.
struct Shape {
  DType dtype;
  int head_dim_qk, head_dim_v;
  bool causal, local, softcap, varlen, aligned16;
  int page_size, threads;
  int block_m, block_n, sub_block_n, stages, warps, rows_per_warp, head_dim_qk_pad;
  int stride_q, stride_k, stride_v, stride_o, offset_q, offset_k, offset_v, offset_o;

  int m_blocks() const { return rows_per_warp / kMmaM; }
  // kKvStream: 16-byte-aligned K/V, contiguous or paged, go through the fixed per-thread KvStream pattern.
  bool kv_stream() const { return aligned16; }
  // Per QK -> softmax -> PV step: the ring runs a key block as block_n / sub_block_n such steps.
  int sub_blocks() const { return block_n / sub_block_n; }
  int tiles_n() const { return sub_block_n / kMmaN; }
  int tiles_dv() const { return head_dim_v / kMmaN; }
  int steps_qk() const { return head_dim_qk_pad / kMmaK; }
  int steps_pv() const { return sub_block_n / kMmaK; }
  int chunks_qk() const { return head_dim_qk / kChunkElems; }
  int chunks_v() const { return head_dim_v / kChunkElems; }
  // kFoldScale: the scale goes into the exponent's FFMA (32-row schedule without softcap only).
  bool fold_scale() const { return m_blocks() > 1 && !softcap; }
  bool ring() const { return stages >= 2; }
  int prologue_blocks() const { return ring() ? stages - 1 : 1; }
  int groups_in_flight() const { return ring() ? 2 * (stages - 2) : 1; }
};

// fj_attention_params fields the kernel reads (ld.param once, at the top).
struct Params {
  Value q, k, v, o, q_strides[3], k_strides[3], v_strides[3], o_strides[3];
  Value maybe_lse, cu_q, cu_k, maybe_seqlens_k, block_table, max_pages;
  Value page_stride_k, page_stride_v;
  Value seqlen_q, seqlen_k, total_q, heads_q, group, window_left, window_right;
  Value scale_log2, softcap, softcap_inv, scale;
};

Params load_params(Emitter &e, Value pp, mlir::LLVM::LLVMStructType t) {
  Params r;
  auto tensor = [&](int which, Value *ptr, Value(&strides)[3]) {
    *ptr = param_at(e, pp, t, {which, kPtr});
    strides[0] = param_at(e, pp, t, {which, kBatchStride});
    strides[1] = param_at(e, pp, t, {which, kRowStride});
    strides[2] = param_at(e, pp, t, {which, kHeadStride});
  };
  tensor(kQ, &r.q, r.q_strides);
  tensor(kK, &r.k, r.k_strides);
  tensor(kV, &r.v, r.v_strides);
  tensor(kO, &r.o, r.o_strides);
  r.maybe_lse = param_at(e, pp, t, {kMaybeLse});
  r.cu_q = param_at(e, pp, t, {kCuQ});
  r.cu_k = param_at(e, pp, t, {kCuK});
  r.maybe_seqlens_k = param_at(e, pp, t, {kMaybeSeqlensK});
  r.block_table = param_at(e, pp, t, {kPaged, kBlockTable});
  r.max_pages = param_at(e, pp, t, {kPaged, kMaxPagesPerSeq});
  r.page_stride_k = param_at(e, pp, t, {kPaged, kPageStrideK});
  r.page_stride_v = param_at(e, pp, t, {kPaged, kPageStrideV});
  r.seqlen_q = param_at(e, pp, t, {kSeqlenQ});
  r.seqlen_k = param_at(e, pp, t, {kSeqlenK});
  r.total_q = param_at(e, pp, t, {kTotalQ});
  r.heads_q = param_at(e, pp, t, {kHeadsQ});
  r.group = param_at(e, pp, t, {kGroup});
  r.window_left = param_at(e, pp, t, {kWindowLeft});
  r.window_right = param_at(e, pp, t, {kWindowRight});
  r.scale_log2 = param_at(e, pp, t, {kScaleLog2});
  r.softcap = param_at(e, pp, t, {kSoftcapField});
  r.softcap_inv = param_at(e, pp, t, {kSoftcapInv});
  r.scale = param_at(e, pp, t, {kScale});
  return r;
}

// The online-softmax state a loop carries (O fragments, row maxima, row sums) as one flat list of
// iter_args, and back.
std::vector<Value> flatten_state(const std::vector<Frag> &o, const std::vector<Value> &row_max,
                                 const std::vector<Value> &row_sum) {
  std::vector<Value> flat;
  for (const Frag &f : o)
    flat.insert(flat.end(), f.begin(), f.end());
  flat.insert(flat.end(), row_max.begin(), row_max.end());
  flat.insert(flat.end(), row_sum.begin(), row_sum.end());
  return flat;
}
void unflatten_state(ValueRange flat, size_t frags, size_t stats, std::vector<Frag> *o, std::vector<Value> *row_max,
                     std::vector<Value> *row_sum) {
  o->assign(frags, {});
  for (size_t f = 0; f < frags; ++f)
    for (int i = 0; i < kFragment; ++i)
      (*o)[f][i] = flat[f * kFragment + i];
  const size_t o_values = frags * kFragment;
  row_max->assign(flat.begin() + o_values, flat.begin() + o_values + stats);
  row_sum->assign(flat.begin() + o_values + stats, flat.begin() + o_values + 2 * stats);
}

// KvStream of kernels/fa2/kv_stream.cuh: thread t copies chunk t % chunks of rows t / chunks + i * rows_per_pass
// of every key/value block, a fixed pattern (the generic load_tile recomputes 64-bit row addresses and
// the shared window for every chunk, right after the per-block barrier). The thread's row and chunk
// come from a fresh %tid.x and the sequence base from the parameters and tile indices each block, so
// nothing per thread is carried across the key loop. When chunks does not divide kThreads, the last
// kThreads % chunks threads stay idle.
struct KvStream {
  int chunks, smem_stride, rows_per_pass, passes;
  bool even; // every (thread, pass) pair names a row inside the block: no per-pass bounds check
  int pass_smem_bytes;
  Value smem_buf0; // buffer 0, !llvm.ptr<3>
};

// The per-CTA view of the problem (Tile of kernels/fa2/tile.cuh): lengths, mask bounds, base pointers.
struct Tile {
  Value batch, head, head_kv, m0, seqlen_q, seqlen_k, shift, left, right;
  Value q_row0, k_row0; // i64
  Value q, k, v;        // row 0 of this (batch, head); k / v = page 0 of the head when paged
};

class Fa2Builder {
public:
  Fa2Builder(Emitter &e, const Shape &sh, const Params &p, Value smem) : e(e), sh(sh), p(p), smem(smem) {}

  void build();

private:
  Emitter &e;
  const Shape &sh;
  const Params &p;
  Value smem; // !llvm.ptr<3>, the dynamic shared memory
  Tile t;

  mlir::Type i16() const { return e.b.getI16Type(); }
  // mov.u32 d, %ctaid.y / %ctaid.z
  Value ctaid_y() { return mlir::NVVM::BlockIdYOp::create(e.b, e.loc, e.i32()); }
  Value ctaid_z() { return mlir::NVVM::BlockIdZOp::create(e.b, e.loc, e.i32()); }
  // The i32 at ptr[index] (a global int array of the parameter block).
  Value load_i32(Value ptr, Value index) { return e.ld_global_nc_s32(e.gep(ptr, e.i32(), e.sext64(index))); }
  Value elems(Value base, Value index) { return e.gep(base, i16(), index); } // base + index 16-bit elements
  Value smem_at(int byte_offset) { return e.gep(smem, e.b.getI8Type(), e.c_i32(byte_offset)); }
  // fma.rn.f32 d, a, b, c — spelled out like fma_rn_f32 of prim/math.cuh
  Value fma(Value a, Value b, Value c) { return mlir::LLVM::FMAOp::create(e.b, e.loc, a, b, c); }
  // A special register read where it is used (an asm volatile mov): LLVM can neither reuse a copy
  // computed before the key loop nor hoist it, so the epilogue does not keep values live across the
  // loop for itself; ptxas re-reads the register (S2R). mov.u32 d, %<name>
  Value sreg_here(const std::string &name) { return e.asm_value(e.i32(), {}, "mov.u32 $0, %" + name + ";", "=r"); }
  // ldmatrix_lane_offset of kernels/fa2/gemm.cuh, in elements: lanes 0-15 name rows 0-15 of columns
  // 0-7, lanes 16-31 the same rows at column 8.
  Value ldmatrix_lane_offset(int stride) {
    Value lane = e.lane_id();
    return e.add(e.mul(e.rem_s(lane, e.c_i32(kMmaM)), e.c_i32(stride)),
                 e.mul(e.div_s(lane, e.c_i32(kMmaM)), e.c_i32(kHalfTile)));
  }
  Value lt(Value x, Value y) { return e.cmp(Pred::slt, x, y); }
  Value ge0(Value x) { return e.cmp(Pred::sge, x, e.c_i32(0)); }
  Value or_(Value x, Value y) { return arith::OrIOp::create(e.b, e.loc, x, y); }

  Value kv_row(Value base, Value page_stride, Value row_stride, Value row);
  template <typename RowPtr>
  void load_tile(Value dst, int rows, int chunks, int smem_stride, Value valid_rows, RowPtr &&row_ptr, Value any_valid);
  void store_tile(Value src, int rows, int chunks, int smem_stride, Value valid_rows, Value global, Value row_stride);
  template <typename Body> void strided_from(Value first, Value total, Body &&body);
  template <typename Body> void strided(Value total, Body &&body) { strided_from(e.tid_x(), total, body); }
  void load_q(Value smem_q);
  void load_kv(bool is_v, Value buffer, Value n_block, Value n_end);
  KvStream kv_stream(int chunks, int smem_stride, Value smem_buf0);
  Value kv_sequence(bool is_v);
  void stream_copy(const KvStream &s, bool full, Value seq, Value tensor, Value buf_bytes, Value n_block,
                   Value row_stride, Value valid_rows);
  void stream_kv(bool is_v, const KvStream &s, Value buf_bytes, Value n_block, Value n_end);
  template <typename Body> void stream_lane(const KvStream &s, Value buf_bytes, Body &&body);
  void stream_copy_paged(const KvStream &s, bool narrow, Value head, Value tensor, Value buf_bytes, Value n_block,
                         Value page_bytes, Value row_bytes, Value valid_rows);
  void stream_kv_paged(bool is_v, const KvStream &s, Value buf_bytes, Value n_block, Value n_end);
  void zero_qk_padding(Value smem_q, Value smem_k);
  std::vector<Frag> gemm_qk(Value q_warp, Value k_buf);
  void gemm_pv(std::vector<Frag> &o, const std::vector<std::array<Value, 4>> &pf, Value v_buf);
  Value tanh_fast(Value x);
  void scores_to_p(std::vector<Frag> &s, std::vector<Frag> &o, std::vector<Value> &row_max, std::vector<Value> &row_sum,
                   Value row0, Value n0, std::vector<std::array<Value, 4>> *pf);
  void softmax_update(int mb, std::vector<Frag> &s, std::vector<Frag> &o, std::vector<Value> &row_max,
                      std::vector<Value> &row_sum);
  void sub_block_steps(Value k_buf, Value v_buf, Value q_warp, Value row0, Value n0, std::vector<Frag> *o,
                       std::vector<Value> *row_max, std::vector<Value> *row_sum);
  Value lse_at(Value row);
  Value output_base();
  void write_empty_tile();
  void main_tile(Value n_begin, Value n_end);
};

// kv_row: start of key/value row `row` (relative to the sequence), through the block table when paged.
Value Fa2Builder::kv_row(Value base, Value page_stride, Value row_stride, Value row) {
  if (sh.page_size > 0) {
    Value slot = e.add(e.mul(e.sext64(t.batch), e.sext64(p.max_pages)), e.sext64(e.div_s(row, e.c_i32(sh.page_size))));
    Value page = e.ld_global_nc_s32(e.gep(p.block_table, e.i32(), slot));
    return elems(base, e.add(e.mul(e.sext64(page), page_stride),
                             e.mul(e.sext64(e.rem_s(row, e.c_i32(sh.page_size))), row_stride)));
  }
  return elems(base, e.mul(e.sext64(row), row_stride));
}

// llvm.loop.unroll.disable on an scf.for: scf-to-cf hands attributes of the llvm dialect on to the
// loop's back-edge branch, where `loop_annotation` is the llvm.br property. Without it LLVM's O3
// runtime-unrolls the thread-strided copy loops (trip counts unknown: they start at tid), and the
// extra live addresses cost 5-15 registers in the key loop (d256: spills). Measured: unrolled by 2
// as the template's `#pragma unroll 2` still costs 2-10 registers over not unrolling.
void no_unroll(Emitter &e, scf::ForOp loop) {
  mlir::MLIRContext *c = e.b.getContext();
  auto unroll = mlir::LLVM::LoopUnrollAttr::get(c, e.b.getBoolAttr(true), {}, {}, {}, {}, {}, {});
  loop->setAttr("loop_annotation",
                mlir::LLVM::LoopAnnotationAttr::get(c, {}, {}, {}, unroll, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}));
}

// Threads sweep items first, first + kThreads, ... < total; `first` is this thread's %tid.x.
template <typename Body> void Fa2Builder::strided_from(Value first, Value total, Body &&body) {
  auto loop = scf::ForOp::create(e.b, e.loc, first, total, e.c_i32(sh.threads), ValueRange{},
                                 [&](mlir::OpBuilder &, mlir::Location, Value idx, ValueRange) {
                                   body(idx);
                                   scf::YieldOp::create(e.b, e.loc);
                                 });
  no_unroll(e, loop);
}

// load_tile: `rows` rows of `chunks` 16-byte chunks into shared memory; rows at or past
// `valid_rows` land as zeros so that padding never turns into NaN.
template <typename RowPtr>
void Fa2Builder::load_tile(Value dst, int rows, int chunks, int smem_stride, Value valid_rows, RowPtr &&row_ptr,
                           Value any_valid) {
  strided(e.c_i32(rows * chunks), [&](Value idx) {
    Value row = arith::DivUIOp::create(e.b, e.loc, idx, e.c_i32(chunks));
    Value col = e.mul(arith::RemUIOp::create(e.b, e.loc, idx, e.c_i32(chunks)), e.c_i32(kChunkElems));
    Value to = e.gep(dst, i16(), e.add(e.mul(row, e.c_i32(smem_stride)), col));
    Value valid = lt(row, valid_rows);
    if (sh.aligned16) {
      // row_ptr only for valid rows: paged, it reads the block table, which ends with the sequence
      Value from = sh.page_size > 0
                       ? if_values(
                             e, valid, mlir::TypeRange{e.ptr()},
                             [&] { return llvm::SmallVector<Value, 1>{elems(row_ptr(row), e.sext64(col))}; },
                             [&] { return llvm::SmallVector<Value, 1>{any_valid}; })[0]
                       : e.select(valid, elems(row_ptr(row), e.sext64(col)), any_valid);
      e.cp_async_cg_16(to, from, e.select(valid, e.c_i32(kChunkBytes), e.c_i32(0)));
      return;
    }
    // Element-aligned rows: eight predicated 16-bit loads, one 16-byte shared store.
    auto v8i16 = mlir::VectorType::get({kChunkElems}, i16());
    Value packed = if_values(
        e, valid, mlir::TypeRange{v8i16},
        [&] {
          Value from = elems(row_ptr(row), e.sext64(col));
          llvm::SmallVector<Value, kChunkElems> vals;
          for (int i = 0; i < kChunkElems; ++i)
            vals.push_back(mlir::LLVM::LoadOp::create(e.b, e.loc, i16(), e.to_global(elems(from, e.c_i32(i))),
                                                      kElemBytes, false, false, /*isInvariant=*/true));
          return llvm::SmallVector<Value, 1>{mlir::vector::FromElementsOp::create(e.b, e.loc, v8i16, vals)};
        },
        [&] {
          return llvm::SmallVector<Value, 1>{
              arith::ConstantOp::create(e.b, e.loc, mlir::DenseElementsAttr::get(v8i16, e.b.getIntegerAttr(i16(), 0)))};
        })[0];
    auto v4i32 = mlir::VectorType::get({kWordsPerChunk}, e.i32());
    e.st_shared(to, mlir::LLVM::BitcastOp::create(e.b, e.loc, v4i32, packed), kChunkBytes);
  });
}

// store_tile: rows below `valid_rows` from shared memory to global (`row_stride` elements apart).
void Fa2Builder::store_tile(Value src, int rows, int chunks, int smem_stride, Value valid_rows, Value global,
                            Value row_stride) {
  auto v4i32 = mlir::VectorType::get({kWordsPerChunk}, e.i32());
  // A fresh %tid.x: the first row / chunk of the sweep, computed from the loop-time tid, would be
  // the KvStream's row / chunk from before the key loop, kept live across it (d128: spilled).
  strided_from(sreg_here("tid.x"), e.c_i32(rows * chunks), [&](Value idx) {
    Value row = arith::DivUIOp::create(e.b, e.loc, idx, e.c_i32(chunks));
    Value col = e.mul(arith::RemUIOp::create(e.b, e.loc, idx, e.c_i32(chunks)), e.c_i32(kChunkElems));
    when(e, lt(row, valid_rows), [&] {
      Value packed = e.ld_shared(v4i32, e.gep(src, i16(), e.add(e.mul(row, e.c_i32(smem_stride)), col)), kChunkBytes);
      Value dst = elems(global, e.add(e.mul(e.sext64(row), row_stride), e.sext64(col)));
      if (sh.aligned16) {
        e.st_global_v4(dst, packed);
        return;
      }
      Value halves = mlir::LLVM::BitcastOp::create(e.b, e.loc, mlir::VectorType::get({kChunkElems}, i16()), packed);
      for (int i = 0; i < kChunkElems; ++i)
        e.st_global_b16(elems(dst, e.c_i32(i)), e.extract(halves, i));
    });
  });
}

// load_q: the query tile, one commit group.
void Fa2Builder::load_q(Value smem_q) {
  Value q = elems(t.q, e.mul(e.sext64(t.m0), p.q_strides[1]));
  load_tile(
      smem_q, sh.block_m, sh.chunks_qk(), sh.stride_q, e.sub(t.seqlen_q, t.m0),
      [&](Value row) { return elems(q, e.mul(e.sext64(row), p.q_strides[1])); }, t.q);
  e.cp_async_commit_group();
}

// load_kv: key (or value) block `n_block` into `buffer`; always one commit group, empty past n_end.
void Fa2Builder::load_kv(bool is_v, Value buffer, Value n_block, Value n_end) {
  when(e, lt(n_block, n_end), [&] {
    Value n0 = e.mul(n_block, e.c_i32(sh.block_n));
    Value base = is_v ? t.v : t.k;
    Value row_stride = is_v ? p.v_strides[1] : p.k_strides[1];
    Value page_stride = is_v ? p.page_stride_v : p.page_stride_k;
    auto row_ptr = [&](Value row) { return kv_row(base, page_stride, row_stride, e.add(n0, row)); };
    load_tile(buffer, sh.block_n, is_v ? sh.chunks_v() : sh.chunks_qk(), is_v ? sh.stride_v : sh.stride_k,
              e.sub(t.seqlen_k, n0), row_ptr, base);
  });
  e.cp_async_commit_group();
}

// kv_stream: the KvStream's constants; `smem_buf0` is buffer 0 of K or V.
KvStream Fa2Builder::kv_stream(int chunks, int smem_stride, Value smem_buf0) {
  KvStream s{};
  s.chunks = chunks;
  s.smem_stride = smem_stride;
  s.rows_per_pass = sh.threads / chunks;
  s.passes = (sh.block_n + s.rows_per_pass - 1) / s.rows_per_pass;
  s.even = sh.threads % chunks == 0 && sh.block_n % s.rows_per_pass == 0;
  s.pass_smem_bytes = s.rows_per_pass * smem_stride * kElemBytes;
  s.smem_buf0 = smem_buf0;
  return s;
}

// kv_sequence: row 0 of this (batch, kv head) in K or V, recomputed from the parameters and the
// tile's indices (uniform registers) rather than carried across the key loop as t.k / t.v.
Value Fa2Builder::kv_sequence(bool is_v) {
  Value ptr = is_v ? p.v : p.k;
  const Value *strides = is_v ? p.v_strides : p.k_strides;
  // %ctaid read here (asm volatile): computed from t.batch / t.head_kv, LLVM hoists both bases out
  // of the key loop into four vector registers, which ptxas then spills at the widest tiles.
  Value head_kv = e.div_s(sreg_here("ctaid.y"), p.group);
  Value seq_off = sh.varlen ? e.mul(t.k_row0, strides[1]) : e.mul(e.sext64(sreg_here("ctaid.z")), strides[0]);
  return elems(ptr, e.add(seq_off, e.mul(e.sext64(head_kv), strides[2])));
}

// stream_lane (KvStream::lane_of): `body(row, chunk_elems, to)` with this thread's first row, its
// chunk's first element and that chunk's address in the buffer `buf_bytes` past buffer 0, for the
// threads that copy; when chunks does not divide kThreads, the last threads skip it.
template <typename Body> void Fa2Builder::stream_lane(const KvStream &s, Value buf_bytes, Body &&body) {
  Value tid = sreg_here("tid.x");
  Value row = arith::DivUIOp::create(e.b, e.loc, tid, e.c_i32(s.chunks));
  Value chunk_elems = e.mul(arith::RemUIOp::create(e.b, e.loc, tid, e.c_i32(s.chunks)), e.c_i32(kChunkElems));
  auto lane = [&] {
    Value to =
        e.gep(s.smem_buf0, e.b.getI8Type(),
              e.add(buf_bytes, e.mul(e.add(e.mul(row, e.c_i32(s.smem_stride)), chunk_elems), e.c_i32(kElemBytes))));
    body(row, chunk_elems, to);
  };
  if (sh.threads % s.chunks == 0)
    lane();
  else
    when(e, lt(row, e.c_i32(s.rows_per_pass)), lane); // the idle threads copy nothing
}

// stream_copy (KvStream::copy): the kBlockN rows of block `n_block` of the sequence `seq` into the
// buffer `buf_bytes` past buffer 0; rows at or past `valid_rows` land as zeros. Full blocks skip the
// row predicates.
void Fa2Builder::stream_copy(const KvStream &s, bool full, Value seq, Value tensor, Value buf_bytes, Value n_block,
                             Value row_stride, Value valid_rows) {
  stream_lane(s, buf_bytes, [&](Value row, Value chunk_elems, Value to) {
    Value pass_stride = e.mul(e.c_i64(s.rows_per_pass), row_stride);
    // The thread's first row as an i32 (below seqlen_k + kBlockN, so it cannot wrap), then widened.
    Value first_row = e.add(e.mul(n_block, e.c_i32(sh.block_n)), row);
    Value from = elems(seq, e.add(e.mul(e.sext64(first_row), row_stride), e.sext64(chunk_elems)));
    Value limit = e.sub(valid_rows, row); // pass i is valid iff i * rows_per_pass < limit
    for (int i = 0; i < s.passes; ++i) {
      const int pass_row = i * s.rows_per_pass;
      auto issue = [&] {
        Value at = e.gep(to, e.b.getI8Type(), e.c_i32(i * s.pass_smem_bytes));
        if (full) {
          e.cp_async_cg_16(at, from, e.c_i32(kChunkBytes));
          return;
        }
        // A zero-filled chunk still names a source (src-size 0 reads nothing): the tensor's first
        // element, which always exists and lives in the parameter space.
        Value valid = lt(e.c_i32(pass_row), limit);
        e.cp_async_cg_16(at, e.select(valid, from, tensor), e.select(valid, e.c_i32(kChunkBytes), e.c_i32(0)));
      };
      if (s.even)
        issue();
      else
        when(e, lt(e.add(row, e.c_i32(pass_row)), e.c_i32(sh.block_n)), issue);
      from = elems(from, pass_stride);
    }
  });
}
void Fa2Builder::stream_kv(bool is_v, const KvStream &s, Value buf_bytes, Value n_block, Value n_end) {
  when(e, lt(n_block, n_end), [&] {
    Value row_stride = is_v ? p.v_strides[1] : p.k_strides[1];
    Value valid_rows = e.sub(t.seqlen_k, e.mul(n_block, e.c_i32(sh.block_n)));
    Value seq = kv_sequence(is_v), tensor = is_v ? p.v : p.k;
    auto branch =
        scf::IfOp::create(e.b, e.loc, e.cmp(Pred::sge, valid_rows, e.c_i32(sh.block_n)), /*withElseRegion=*/true);
    mlir::OpBuilder::InsertionGuard guard(e.b);
    e.b.setInsertionPoint(branch.thenBlock()->getTerminator());
    stream_copy(s, /*full=*/true, seq, tensor, buf_bytes, n_block, row_stride, valid_rows);
    e.b.setInsertionPoint(branch.elseBlock()->getTerminator());
    stream_copy(s, /*full=*/false, seq, tensor, buf_bytes, n_block, row_stride, valid_rows);
  });
  e.cp_async_commit_group();
}

// stream_copy_paged (KvStream::copy_paged): the kBlockN rows of block `n_block` of this sequence
// through the block table into the buffer `buf_bytes` past buffer 0. Each pass's row reads its page
// number (rows at or past `valid_rows` read none and land as zeros); `narrow`: the byte strides fit
// 32 bits, and a row's address is one mul.wide from its page number (page_bytes, row_bytes i32),
// else i64 arithmetic.
void Fa2Builder::stream_copy_paged(const KvStream &s, bool narrow, Value head, Value tensor, Value buf_bytes,
                                   Value n_block, Value page_bytes, Value row_bytes, Value valid_rows) {
  // count * bytes as a 64-bit byte offset: mul.wide.s32 when narrow.
  auto offset = [&](Value count, Value bytes) {
    return narrow ? e.asm_value(e.i64(), {count, bytes}, "mul.wide.s32 $0, $1, $2;", "=l,r,r")
                  : e.mul(e.sext64(count), bytes);
  };
  stream_lane(s, buf_bytes, [&](Value row, Value chunk_elems, Value to) {
    Value from = elems(head, e.sext64(chunk_elems));
    // %ctaid.z read here, as in kv_sequence: t.batch would be carried across the key loop.
    Value table = e.gep(p.block_table, e.i32(), e.mul(e.sext64(sreg_here("ctaid.z")), e.sext64(p.max_pages)));
    Value key0 = e.add(e.mul(n_block, e.c_i32(sh.block_n)), row); // unsigned below: a multiply and a shift
    Value limit = e.sub(valid_rows, row);
    for (int i = 0; i < s.passes; ++i) {
      const int pass_row = i * s.rows_per_pass;
      auto issue = [&] {
        Value at = e.gep(to, e.b.getI8Type(), e.c_i32(i * s.pass_smem_bytes));
        Value valid = lt(e.c_i32(pass_row), limit);
        Value key = e.add(key0, e.c_i32(pass_row));
        Value src = if_values(
            e, valid, mlir::TypeRange{tensor.getType()},
            [&] {
              Value page = e.ld_global_nc_s32(
                  e.gep(table, e.i32(), e.sext64(arith::DivUIOp::create(e.b, e.loc, key, e.c_i32(sh.page_size)))));
              Value at_row = e.gep(from, e.b.getI8Type(), offset(page, page_bytes));
              if (sh.page_size > 1)
                at_row = e.gep(at_row, e.b.getI8Type(),
                               offset(arith::RemUIOp::create(e.b, e.loc, key, e.c_i32(sh.page_size)), row_bytes));
              return llvm::SmallVector<Value>{at_row};
            },
            [&] { return llvm::SmallVector<Value>{tensor}; })[0];
        e.cp_async_cg_16(at, src, e.select(valid, e.c_i32(kChunkBytes), e.c_i32(0)));
      };
      if (s.even)
        issue();
      else
        when(e, lt(e.add(row, e.c_i32(pass_row)), e.c_i32(sh.block_n)), issue);
    }
  });
}

// stream_kv_paged: block `n_block` of paged K or V through the stream (the 32-bit form where the
// byte strides fit it); always one commit group, empty past n_end.
void Fa2Builder::stream_kv_paged(bool is_v, const KvStream &s, Value buf_bytes, Value n_block, Value n_end) {
  when(e, lt(n_block, n_end), [&] {
    const Value *strides = is_v ? p.v_strides : p.k_strides;
    Value tensor = is_v ? p.v : p.k;
    Value head_kv = e.div_s(sreg_here("ctaid.y"), p.group);
    Value head = elems(tensor, e.mul(e.sext64(head_kv), strides[2]));
    Value page_bytes = e.mul(is_v ? p.page_stride_v : p.page_stride_k, e.c_i64(kElemBytes));
    Value row_bytes = e.mul(strides[1], e.c_i64(kElemBytes));
    Value valid_rows = e.sub(t.seqlen_k, e.mul(n_block, e.c_i32(sh.block_n)));
    auto fits = [&](Value v) { return e.cmp(Pred::eq, e.sext64(arith::TruncIOp::create(e.b, e.loc, e.i32(), v)), v); };
    auto branch = scf::IfOp::create(e.b, e.loc, arith::AndIOp::create(e.b, e.loc, fits(page_bytes), fits(row_bytes)),
                                    /*withElseRegion=*/true);
    mlir::OpBuilder::InsertionGuard guard(e.b);
    e.b.setInsertionPoint(branch.thenBlock()->getTerminator());
    stream_copy_paged(s, /*narrow=*/true, head, tensor, buf_bytes, n_block,
                      arith::TruncIOp::create(e.b, e.loc, e.i32(), page_bytes),
                      arith::TruncIOp::create(e.b, e.loc, e.i32(), row_bytes), valid_rows);
    e.b.setInsertionPoint(branch.elseBlock()->getTerminator());
    stream_copy_paged(s, /*narrow=*/false, head, tensor, buf_bytes, n_block, page_bytes, row_bytes, valid_rows);
  });
  e.cp_async_commit_group();
}

// zero_qk_padding: columns head_dim_qk..head_dim_qk_pad of Q and of every K buffer are read by the
// MMA; uninitialized shared memory may hold NaN bit patterns.
void Fa2Builder::zero_qk_padding(Value smem_q, Value smem_k) {
  if (sh.head_dim_qk_pad == sh.head_dim_qk)
    return;
  const int k_rows = sh.stages * sh.block_n;
  Value zero = arith::ConstantOp::create(
      e.b, e.loc,
      mlir::DenseElementsAttr::get(mlir::VectorType::get({kWordsPerChunk}, e.i32()), e.b.getI32IntegerAttr(0)));
  strided(e.c_i32(sh.block_m + k_rows), [&](Value row) {
    Value in_q = lt(row, e.c_i32(sh.block_m));
    Value q_row = e.gep(smem_q, i16(), e.mul(row, e.c_i32(sh.stride_q)));
    Value k_row = e.gep(smem_k, i16(), e.mul(e.sub(row, e.c_i32(sh.block_m)), e.c_i32(sh.stride_k)));
    e.st_shared(e.gep(e.select(in_q, q_row, k_row), i16(), e.c_i32(sh.head_dim_qk)), zero, kChunkBytes);
  });
}

// gemm_qk: S = Q K^T for this warp's rows and the kBlockN keys of one buffer; each K fragment is
// loaded once and multiplied into every m16 row block.
std::vector<Frag> Fa2Builder::gemm_qk(Value q_warp, Value k_buf) {
  // A (Q) matrices go rows 0-7 / 8-15 then columns 0-7 / 8-15 (ldmatrix_lane_offset); each x4 of
  // K covers two n8 key tiles (keys 0-7 then 8-15), columns 0-7 / 8-15 within each, so each tile's
  // B pair is two consecutive registers.
  Value lane = e.lane_id();
  Value half16 = e.div_s(lane, e.c_i32(kMmaM));
  Value lane8 = e.rem_s(lane, e.c_i32(kHalfTile)), matrix2 = e.rem_s(e.div_s(lane, e.c_i32(kHalfTile)), e.c_i32(2));
  Value q_addr = e.gep(q_warp, i16(), ldmatrix_lane_offset(sh.stride_q));
  Value k_addr = e.gep(k_buf, i16(),
                       e.add(e.mul(e.add(lane8, e.mul(half16, e.c_i32(kHalfTile))), e.c_i32(sh.stride_k)),
                             e.mul(matrix2, e.c_i32(kHalfTile))));
  const int n = sh.tiles_n();
  Value zero = e.c_f32(0.f);
  std::vector<Frag> s(sh.m_blocks() * n, {zero, zero, zero, zero});
  for (int kk = 0; kk < sh.steps_qk(); ++kk) {
    std::vector<std::array<Value, 4>> a(sh.m_blocks());
    for (int mb = 0; mb < sh.m_blocks(); ++mb)
      a[mb] = e.ldmatrix_x4(e.gep(q_addr, i16(), e.c_i32(mb * kMmaM * sh.stride_q + kk * kMmaK)), false);
    for (int jj = 0; jj < n / 2; ++jj) {
      auto b = e.ldmatrix_x4(e.gep(k_addr, i16(), e.c_i32(jj * 2 * kMmaN * sh.stride_k + kk * kMmaK)), false);
      for (int mb = 0; mb < sh.m_blocks(); ++mb) {
        s[mb * n + 2 * jj] = e.mma_m16n8k16(sh.dtype, a[mb], {b[0], b[1]}, s[mb * n + 2 * jj]);
        s[mb * n + 2 * jj + 1] = e.mma_m16n8k16(sh.dtype, a[mb], {b[2], b[3]}, s[mb * n + 2 * jj + 1]);
      }
    }
  }
  return s;
}

// gemm_pv: O += P V, P's C fragments repacked as A fragments, V read transposed by ldmatrix.trans;
// each V fragment feeds every row block; head_dim_v = 8 (mod 16) ends with one x2 n8 tile.
void Fa2Builder::gemm_pv(std::vector<Frag> &o, const std::vector<std::array<Value, 4>> &pf, Value v_buf) {
  Value v_addr = e.gep(v_buf, i16(), ldmatrix_lane_offset(sh.stride_v));
  const int dv = sh.tiles_dv(), steps = sh.steps_pv();
  for (int kk = 0; kk < steps; ++kk) {
    const int row_offset = kk * kMmaK * sh.stride_v;
    for (int jj = 0; jj < dv / 2; ++jj) {
      auto b = e.ldmatrix_x4(e.gep(v_addr, i16(), e.c_i32(row_offset + jj * 2 * kMmaN)), true);
      for (int mb = 0; mb < sh.m_blocks(); ++mb) {
        o[mb * dv + 2 * jj] = e.mma_m16n8k16(sh.dtype, pf[mb * steps + kk], {b[0], b[1]}, o[mb * dv + 2 * jj]);
        o[mb * dv + 2 * jj + 1] = e.mma_m16n8k16(sh.dtype, pf[mb * steps + kk], {b[2], b[3]}, o[mb * dv + 2 * jj + 1]);
      }
    }
    if (dv % 2 == 1) {
      auto b = ldmatrix_x2(e, e.gep(v_addr, i16(), e.c_i32(row_offset + (dv - 1) * kMmaN)), true);
      for (int mb = 0; mb < sh.m_blocks(); ++mb)
        o[mb * dv + dv - 1] = e.mma_m16n8k16(sh.dtype, pf[mb * steps + kk], b, o[mb * dv + dv - 1]);
    }
  }
}

// tanh_fast of prim/math.cuh: 1 - 2 / (2^(2x log2 e) + 1).
Value Fa2Builder::tanh_fast(Value x) {
  return e.fsub(e.c_f32(1.f), e.fmul(e.c_f32(2.f), e.rcp_approx(e.fadd(e.ex2_approx(e.fmul(x, e.c_f32(2.f * kLog2e))),
                                                                       e.c_f32(1.f)))));
}

// softmax_update of one m16 row block: running max / thread-partial sum of this thread's two rows,
// O rescaled, S turned into P in place. With fold_scale S and the max are raw Q K^T.
void Fa2Builder::softmax_update(int mb, std::vector<Frag> &s, std::vector<Frag> &o, std::vector<Value> &row_max,
                                std::vector<Value> &row_sum) {
  const int n = sh.tiles_n(), dv = sh.tiles_dv();
  Value neg_inf = e.neg_inf(), zero = e.c_f32(0.f);
  for (int r = 0; r < kRowsPerFragment; ++r) {
    Value block_max = neg_inf;
    for (int j = 0; j < n; ++j)
      block_max = e.max_f32(block_max, e.max_f32(s[mb * n + j][2 * r], s[mb * n + j][2 * r + 1]));
    Value &max = row_max[mb * kRowsPerFragment + r];
    Value new_max = e.max_f32(max, e.quad_reduce_max(block_max));
    // A row that has seen only masked keys keeps max -inf: exponentiate against 0 so that
    // exp2(-inf - -inf) never produces NaN.
    Value empty = e.cmpf(FPred::OEQ, new_max, neg_inf);
    Value ref, correction;
    if (sh.fold_scale()) {
      ref = e.select(empty, zero, e.fmul(new_max, p.scale_log2));
      correction = e.ex2_approx(fma(max, p.scale_log2, e.fneg(ref)));
    } else {
      ref = e.select(empty, zero, new_max);
      correction = e.ex2_approx(e.fsub(max, ref));
    }
    max = new_max;
    Value sum = zero;
    for (int j = 0; j < n; ++j) {
      Frag &f = s[mb * n + j];
      for (int i = 0; i < 2; ++i)
        f[2 * r + i] = sh.fold_scale() ? e.ex2_approx(fma(f[2 * r + i], p.scale_log2, e.fneg(ref)))
                                       : e.ex2_approx(e.fsub(f[2 * r + i], ref));
      sum = e.fadd(sum, e.fadd(f[2 * r], f[2 * r + 1]));
    }
    Value &total = row_sum[mb * kRowsPerFragment + r];
    total = e.fadd(e.fmul(total, correction), sum);
    for (int d = 0; d < dv; ++d) {
      o[mb * dv + d][2 * r] = e.fmul(o[mb * dv + d][2 * r], correction);
      o[mb * dv + d][2 * r + 1] = e.fmul(o[mb * dv + d][2 * r + 1], correction);
    }
  }
}

// sub_block_steps: the math of one ring key block, as sub_blocks() QK -> softmax -> PV steps of
// sub_block_n keys in a loop that is not unrolled, as the template: unrolled, ptxas overlaps one
// step's PV with the next one's QK and the wide tiles spill. One step is emitted inline.
void Fa2Builder::sub_block_steps(Value k_buf, Value v_buf, Value q_warp, Value row0, Value n0, std::vector<Frag> *o,
                                 std::vector<Value> *row_max, std::vector<Value> *row_sum) {
  auto step = [&](Value k_sub, Value v_sub, Value n_sub) {
    std::vector<std::array<Value, 4>> pf;
    std::vector<Frag> s = gemm_qk(q_warp, k_sub);
    scores_to_p(s, *o, *row_max, *row_sum, row0, n_sub, &pf);
    gemm_pv(*o, pf, v_sub);
  };
  if (sh.sub_blocks() == 1) {
    step(k_buf, v_buf, n0);
    return;
  }
  const size_t frags = o->size(), stats = row_max->size();
  auto loop = scf::ForOp::create(
      e.b, e.loc, e.c_i32(0), e.c_i32(sh.sub_blocks()), e.c_i32(1), flatten_state(*o, *row_max, *row_sum),
      [&](mlir::OpBuilder &, mlir::Location, Value sub, ValueRange values) {
        unflatten_state(values, frags, stats, o, row_max, row_sum);
        Value first_key = e.mul(sub, e.c_i32(sh.sub_block_n));
        step(e.gep(k_buf, i16(), e.mul(first_key, e.c_i32(sh.stride_k))),
             e.gep(v_buf, i16(), e.mul(first_key, e.c_i32(sh.stride_v))), e.add(n0, first_key));
        scf::YieldOp::create(e.b, e.loc, flatten_state(*o, *row_max, *row_sum));
      });
  no_unroll(e, loop);
  unflatten_state(loop.getResults(), frags, stats, o, row_max, row_sum);
}

// scores_to_p: scale (or softcap), mask where the block needs it, online softmax, 16-bit P.
void Fa2Builder::scores_to_p(std::vector<Frag> &s, std::vector<Frag> &o, std::vector<Value> &row_max,
                             std::vector<Value> &row_sum, Value row0, Value n0, std::vector<std::array<Value, 4>> *pf) {
  if (!sh.fold_scale()) {
    Value softcap_scale = sh.softcap ? e.fmul(p.scale, p.softcap_inv) : Value{};
    Value softcap_out = sh.softcap ? e.fmul(p.softcap, e.c_f32(kLog2e)) : Value{};
    for (Frag &f : s)
      for (Value &x : f)
        x = sh.softcap ? e.fmul(tanh_fast(e.fmul(x, softcap_scale)), softcap_out) : e.fmul(x, p.scale_log2);
  }
  // Only blocks that cross seqlen_k or an edge of the band pay for the mask.
  Value crosses_end = e.cmp(Pred::sgt, e.add(n0, e.c_i32(sh.sub_block_n)), t.seqlen_k);
  Value diag0 = e.add(t.m0, t.shift);
  Value crosses_right =
      e.and_(ge0(t.right), e.cmp(Pred::sgt, e.add(n0, e.c_i32(sh.sub_block_n - 1)), e.add(diag0, t.right)));
  Value crosses_left = e.and_(ge0(t.left), lt(n0, e.sub(e.add(diag0, e.c_i32(sh.block_m - 1)), t.left)));
  Value needs_mask = or_(crosses_end, or_(crosses_right, crosses_left));
  // Per row block, as the template: mask (when the block needs it), online softmax, 16-bit P.
  const int n = sh.tiles_n();
  pf->clear();
  for (int mb = 0; mb < sh.m_blocks(); ++mb) {
    std::vector<Value> flat;
    for (int j = 0; j < n; ++j)
      flat.insert(flat.end(), s[mb * n + j].begin(), s[mb * n + j].end());
    llvm::SmallVector<mlir::Type> types(flat.size(), e.f32());
    auto masked = if_values(
        e, needs_mask, types,
        [&] {
          // mask_logits: keys past seqlen_k or outside the causal / window band -> -inf
          llvm::SmallVector<Value> out;
          Value lane = e.lane_id();
          Value col_base = e.add(n0, e.mul(e.rem_s(lane, e.c_i32(kQuadSize)), e.c_i32(2)));
          Value right_on = ge0(t.right), left_on = ge0(t.left);
          // Each element's distance from its row's diagonal is one value plus a constant (one
          // register for the band across the key loop, not a hoisted bound per row).
          Value from_diag = e.sub(col_base, e.add(row0, t.shift));
          Value neg_left = e.sub(e.c_i32(0), t.left);
          for (int j = 0; j < n; ++j)
            for (int i = 0; i < kFragment; ++i) {
              Value col = e.add(col_base, e.c_i32(j * kMmaN + i % 2));
              Value dist = e.add(from_diag, e.c_i32(j * kMmaN + i % 2 - mb * kMmaM - (i / 2) * kHalfTile));
              Value out_of_band = e.cmp(Pred::sge, col, t.seqlen_k);
              out_of_band = or_(out_of_band, e.and_(right_on, e.cmp(Pred::sgt, dist, t.right)));
              out_of_band = or_(out_of_band, e.and_(left_on, lt(dist, neg_left)));
              out.push_back(e.select(out_of_band, e.neg_inf(), s[mb * n + j][i]));
            }
          return out;
        },
        [&] { return llvm::SmallVector<Value>(flat.begin(), flat.end()); });
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < kFragment; ++i)
        s[mb * n + j][i] = masked[j * kFragment + i];
    softmax_update(mb, s, o, row_max, row_sum);
    // pack_p: the C layout of two n8 tiles is the A layout of one k16 step.
    for (int kk = 0; kk < sh.steps_pv(); ++kk) {
      const Frag &lo = s[mb * n + 2 * kk], &hi = s[mb * n + 2 * kk + 1];
      pf->push_back({e.pack2_from_f32(sh.dtype, lo[0], lo[1]), e.pack2_from_f32(sh.dtype, lo[2], lo[3]),
                     e.pack2_from_f32(sh.dtype, hi[0], hi[1]), e.pack2_from_f32(sh.dtype, hi[2], hi[3])});
    }
  }
}

// lse_at: [batch, heads_q, seqlen_q], or varlen [heads_q, total_q].
Value Fa2Builder::lse_at(Value row) {
  Value index;
  if (sh.varlen)
    index = e.add(e.add(e.mul(e.sext64(t.head), e.sext64(p.total_q)), t.q_row0), e.sext64(row));
  else
    index = e.add(e.mul(e.add(e.mul(e.sext64(t.batch), e.sext64(p.heads_q)), e.sext64(t.head)), e.sext64(p.seqlen_q)),
                  e.sext64(row));
  return e.gep(p.maybe_lse, e.f32(), index);
}

// output_base: row 0 of this (batch, head) in O.
Value Fa2Builder::output_base() {
  Value o_off = sh.varlen ? e.mul(t.q_row0, p.o_strides[1]) : e.mul(e.sext64(t.batch), p.o_strides[0]);
  return elems(p.o, e.add(o_off, e.mul(e.sext64(t.head), p.o_strides[2])));
}

// write_empty_tile: rows that see no key at all get O = 0, LSE = -inf.
void Fa2Builder::write_empty_tile() {
  Value rows = e.min_s(e.c_i32(sh.block_m), e.sub(t.seqlen_q, t.m0));
  Value o = output_base();
  Value zero16 = arith::ConstantIntOp::create(e.b, e.loc, i16(), 0);
  strided(e.mul(rows, e.c_i32(sh.head_dim_v)), [&](Value idx) {
    Value row = e.div_s(idx, e.c_i32(sh.head_dim_v));
    Value offset =
        e.add(e.mul(e.sext64(e.add(t.m0, row)), p.o_strides[1]), e.sext64(e.rem_s(idx, e.c_i32(sh.head_dim_v))));
    e.st_global_b16(elems(o, offset), zero16);
  });
  when(e, e.not_(e.is_null(p.maybe_lse)),
       [&] { strided(rows, [&](Value row) { e.st_global_f32(lse_at(e.add(t.m0, row)), e.neg_inf()); }); });
}

// The key loop and the epilogue of fj_fa2_prefill for key blocks [n_begin, n_end).
void Fa2Builder::main_tile(Value n_begin, Value n_end) {
  Value smem_q = smem_at(sh.offset_q), smem_k = smem_at(sh.offset_k), smem_v = smem_at(sh.offset_v);
  Value smem_o = smem_at(sh.offset_o);
  const int stage_k = sh.block_n * sh.stride_k, stage_v = sh.block_n * sh.stride_v; // elements per buffer
  auto k_stage = [&](Value stage) { return e.gep(smem_k, i16(), e.mul(stage, e.c_i32(stage_k))); };
  auto v_stage = [&](Value stage) { return e.gep(smem_v, i16(), e.mul(stage, e.c_i32(stage_v))); };
  const int stage_k_bytes = stage_k * kElemBytes, stage_v_bytes = stage_v * kElemBytes;
  KvStream k_stream{}, v_stream{};
  if (sh.kv_stream()) {
    k_stream = kv_stream(sh.chunks_qk(), sh.stride_k, smem_k);
    v_stream = kv_stream(sh.chunks_v(), sh.stride_v, smem_v);
  }
  // Block `n_block` of K and V into the buffers of `stage`, streamed or through load_tile.
  auto load_k = [&](Value stage, Value n_block) {
    if (sh.kv_stream() && sh.page_size > 0)
      stream_kv_paged(false, k_stream, e.mul(stage, e.c_i32(stage_k_bytes)), n_block, n_end);
    else if (sh.kv_stream())
      stream_kv(false, k_stream, e.mul(stage, e.c_i32(stage_k_bytes)), n_block, n_end);
    else
      load_kv(false, k_stage(stage), n_block, n_end);
  };
  auto load_v = [&](Value stage, Value n_block) {
    if (sh.kv_stream() && sh.page_size > 0)
      stream_kv_paged(true, v_stream, e.mul(stage, e.c_i32(stage_v_bytes)), n_block, n_end);
    else if (sh.kv_stream())
      stream_kv(true, v_stream, e.mul(stage, e.c_i32(stage_v_bytes)), n_block, n_end);
    else
      load_kv(true, v_stage(stage), n_block, n_end);
  };

  zero_qk_padding(smem_q, smem_k);
  load_q(smem_q);
  for (int s = 0; s < sh.prologue_blocks(); ++s) {
    load_k(e.c_i32(s), e.add(n_begin, e.c_i32(s)));
    load_v(e.c_i32(s), e.add(n_begin, e.c_i32(s)));
  }

  Value warp = e.warp_id(), lane = e.lane_id();
  Value q_warp = e.gep(smem_q, i16(), e.mul(warp, e.c_i32(sh.rows_per_warp * sh.stride_q)));
  // query row of c0, c1 (block 0)
  Value row0 = e.add(e.add(t.m0, e.mul(warp, e.c_i32(sh.rows_per_warp))), e.div_s(lane, e.c_i32(kQuadSize)));

  const int mbs = sh.m_blocks(), dv = sh.tiles_dv();
  const int o_values = mbs * dv * kFragment, stats = mbs * kRowsPerFragment;
  Value zero = e.c_f32(0.f), neg_inf = e.neg_inf();
  std::vector<Value> init(o_values, zero);
  init.insert(init.end(), stats, neg_inf); // row_max
  init.insert(init.end(), stats, zero);    // row_sum
  auto unpack = [&](ValueRange values, std::vector<Frag> *o, std::vector<Value> *row_max, std::vector<Value> *row_sum) {
    unflatten_state(values, mbs * dv, stats, o, row_max, row_sum);
  };

  auto loop =
      scf::ForOp::create(e.b, e.loc, n_begin, n_end, e.c_i32(1), init,
                         [&](mlir::OpBuilder &, mlir::Location, Value n_block, ValueRange values) {
                           std::vector<Frag> o;
                           std::vector<Value> row_max, row_sum;
                           unpack(values, &o, &row_max, &row_sum);
                           Value stage = e.rem_s(e.sub(n_block, n_begin), e.c_i32(sh.stages));
                           Value n0 = e.mul(n_block, e.c_i32(sh.block_n));
                           Value k_buf = k_stage(stage), v_buf = v_stage(stage);
                           std::vector<std::array<Value, 4>> pf;
                           if (sh.ring()) {
                             e.cp_async_wait_group(sh.groups_in_flight());
                             e.bar_sync(); // K_j, V_j visible; every warp is done with block j-1, whose buffers refill
                             Value ahead = e.add(n_block, e.c_i32(sh.stages - 1));
                             Value ahead_stage = e.rem_s(e.sub(ahead, n_begin), e.c_i32(sh.stages));
                             load_k(ahead_stage, ahead);
                             load_v(ahead_stage, ahead);
                             sub_block_steps(k_buf, v_buf, q_warp, row0, n0, &o, &row_max, &row_sum);
                           } else {
                             Value next = e.add(n_block, e.c_i32(1));
                             e.cp_async_wait_group(sh.groups_in_flight());
                             e.bar_sync(); // K_j (and Q) visible to every warp
                             std::vector<Frag> s = gemm_qk(q_warp, k_buf);
                             e.bar_sync(); // every warp is done with the K buffer
                             load_k(e.c_i32(0), next);
                             scores_to_p(s, o, row_max, row_sum, row0, n0, &pf);
                             e.cp_async_wait_group(sh.groups_in_flight());
                             e.bar_sync(); // V_j visible
                             gemm_pv(o, pf, v_buf);
                             e.bar_sync(); // every warp is done with the V buffer
                             load_v(e.c_i32(0), next);
                           }
                           scf::YieldOp::create(e.b, e.loc, flatten_state(o, row_max, row_sum));
                         });
  no_unroll(e, loop);
  e.cp_async_wait_group(0);

  // Epilogue: normalize, stage O through shared memory for 16-byte row stores, write the LSE.
  std::vector<Frag> o;
  std::vector<Value> row_max, row_sum;
  unpack(loop.getResults(), &o, &row_max, &row_sum);
  std::vector<Value> inv_sum(stats);
  Value lse_wanted =
      e.and_(e.not_(e.is_null(p.maybe_lse)), e.cmp(Pred::eq, e.rem_s(lane, e.c_i32(kQuadSize)), e.c_i32(0)));
  for (int mb = 0; mb < mbs; ++mb)
    for (int r = 0; r < kRowsPerFragment; ++r) {
      const int i = mb * kRowsPerFragment + r;
      Value sum = e.quad_reduce_sum(row_sum[i]);
      Value positive = e.cmpf(FPred::OGT, sum, zero);
      inv_sum[i] = e.select(positive, arith::DivFOp::create(e.b, e.loc, e.c_f32(1.f), sum), zero);
      Value row = e.add(row0, e.c_i32(mb * kMmaM + r * kHalfTile));
      when(e, e.and_(lse_wanted, lt(row, t.seqlen_q)), [&] {
        // the running max is in log2 units, or raw Q K^T when the scale is folded
        Value max_log2 = sh.fold_scale() ? e.fmul(row_max[i], p.scale_log2) : row_max[i];
        Value lse = e.select(positive, e.fmul(e.fadd(max_log2, e.lg2_approx(sum)), e.c_f32(kLn2)), neg_inf);
        e.st_global_f32(lse_at(row), lse);
      });
    }
  e.bar_sync(); // the O staging area may overlap Q / K rows other warps still read
  // The warp's staging rows from a fresh %tid.x: where the O and Q areas share offset and stride,
  // LLVM would reuse q_warp from before the key loop and carry it across the loop for the epilogue
  // alone (d128 at 255 registers: that value spilled).
  Value o_warp_rows = e.mul(arith::DivUIOp::create(e.b, e.loc, sreg_here("tid.x"), e.c_i32(kWarpSize)),
                            e.c_i32(sh.rows_per_warp * sh.stride_o));
  Value o_warp = e.gep(smem_o, i16(), o_warp_rows);
  Value col = e.mul(e.rem_s(lane, e.c_i32(kQuadSize)), e.c_i32(2));
  Value group_row = e.div_s(lane, e.c_i32(kQuadSize));
  for (int mb = 0; mb < mbs; ++mb)
    for (int d = 0; d < dv; ++d)
      for (int r = 0; r < kRowsPerFragment; ++r) {
        const int i = mb * kRowsPerFragment + r;
        Value row = e.add(group_row, e.c_i32(mb * kMmaM + r * kHalfTile));
        Value at = e.add(e.mul(row, e.c_i32(sh.stride_o)), e.add(col, e.c_i32(d * kMmaN)));
        Value pair = e.pack2_from_f32(sh.dtype, e.fmul(o[mb * dv + d][2 * r], inv_sum[i]),
                                      e.fmul(o[mb * dv + d][2 * r + 1], inv_sum[i]));
        e.st_shared(e.gep(o_warp, i16(), at), pair, kF32Bytes);
      }
  e.bar_sync();
  Value o_rows = elems(output_base(), e.mul(e.sext64(t.m0), p.o_strides[1]));
  store_tile(smem_o, sh.block_m, sh.chunks_v(), sh.stride_o, e.sub(t.seqlen_q, t.m0), o_rows, p.o_strides[1]);
}

// fj_fa2_prefill: make_tile, the key-block range, then the empty-tile path or the key loop.
void Fa2Builder::build() {
  t.batch = ctaid_z();
  t.head = ctaid_y();
  t.head_kv = e.div_s(t.head, p.group);
  // Causal: query blocks from the end, heavy tiles first (as make_tile in kernels/fa2/tile.cuh).
  Value block_x = mlir::NVVM::BlockIdXOp::create(e.b, e.loc, e.i32());
  Value m_block = sh.causal ? e.sub(e.sub(e.nctaid_x(), block_x), e.c_i32(1)) : block_x;
  t.m0 = e.mul(m_block, e.c_i32(sh.block_m));
  if (sh.varlen) {
    Value first = load_i32(p.cu_q, t.batch);
    t.q_row0 = e.sext64(first);
    t.seqlen_q = e.sub(load_i32(p.cu_q, e.add(t.batch, e.c_i32(1))), first);
  } else {
    t.q_row0 = e.c_i64(0);
    t.seqlen_q = p.seqlen_q;
  }
  // Varlen grids are sized for the longest sequence: tiles past the end of theirs do nothing.
  when(e, lt(t.m0, t.seqlen_q), [&] {
    Value k_first = e.c_i32(0), seqlen_k = p.seqlen_k;
    if (sh.varlen) {
      Value cu_k = e.not_(e.is_null(p.cu_k));
      k_first = if_values(
          e, cu_k, mlir::TypeRange{e.i32()}, [&] { return llvm::SmallVector<Value, 1>{load_i32(p.cu_k, t.batch)}; },
          [&] { return llvm::SmallVector<Value, 1>{e.c_i32(0)}; })[0];
      seqlen_k = if_values(
          e, cu_k, mlir::TypeRange{e.i32()},
          [&] { return llvm::SmallVector<Value, 1>{e.sub(load_i32(p.cu_k, e.add(t.batch, e.c_i32(1))), k_first)}; },
          [&] { return llvm::SmallVector<Value, 1>{p.seqlen_k}; })[0];
    }
    t.k_row0 = e.sext64(k_first);
    t.seqlen_k = if_values(
        e, e.is_null(p.maybe_seqlens_k), mlir::TypeRange{e.i32()},
        [&] { return llvm::SmallVector<Value, 1>{seqlen_k}; },
        [&] { return llvm::SmallVector<Value, 1>{load_i32(p.maybe_seqlens_k, t.batch)}; })[0];
    t.shift = e.sub(t.seqlen_k, t.seqlen_q);
    // Causal is the window (inf, 0); a user window intersects with it.
    t.right = e.c_i32(sh.causal ? 0 : -1);
    t.left = e.c_i32(-1);
    if (sh.local) {
      Value capped = sh.causal ? e.min_s(t.right, p.window_right) : p.window_right;
      t.right = e.select(ge0(p.window_right), capped, t.right);
      t.left = p.window_left;
    }
    Value q_off = sh.varlen ? e.mul(t.q_row0, p.q_strides[1]) : e.mul(e.sext64(t.batch), p.q_strides[0]);
    t.q = elems(p.q, e.add(q_off, e.mul(e.sext64(t.head), p.q_strides[2])));
    Value k_off = e.c_i64(0), v_off = e.c_i64(0);
    if (sh.page_size == 0) {
      k_off = sh.varlen ? e.mul(t.k_row0, p.k_strides[1]) : e.mul(e.sext64(t.batch), p.k_strides[0]);
      v_off = sh.varlen ? e.mul(t.k_row0, p.v_strides[1]) : e.mul(e.sext64(t.batch), p.v_strides[0]);
    }
    t.k = elems(p.k, e.add(k_off, e.mul(e.sext64(t.head_kv), p.k_strides[2])));
    t.v = elems(p.v, e.add(v_off, e.mul(e.sext64(t.head_kv), p.v_strides[2])));

    // Key blocks [n_begin, n_end) that intersect the band of some row of this tile.
    Value m_last = e.sub(e.min_s(e.add(t.m0, e.c_i32(sh.block_m)), t.seqlen_q), e.c_i32(1));
    Value key_end = e.select(
        ge0(t.right), e.min_s(t.seqlen_k, e.add(e.add(m_last, t.shift), e.add(t.right, e.c_i32(1)))), t.seqlen_k);
    Value key_begin = e.select(ge0(t.left), e.max_s(e.c_i32(0), e.sub(e.add(t.m0, t.shift), t.left)), e.c_i32(0));
    Value n_begin = e.div_s(key_begin, e.c_i32(sh.block_n));
    Value ceil_end = e.div_s(e.add(key_end, e.c_i32(sh.block_n - 1)), e.c_i32(sh.block_n));
    Value n_end = e.select(e.cmp(Pred::sgt, key_end, key_begin), ceil_end, n_begin);
    auto branch = scf::IfOp::create(e.b, e.loc, e.cmp(Pred::sle, n_end, n_begin), /*withElseRegion=*/true);
    mlir::OpBuilder::InsertionGuard guard(e.b);
    e.b.setInsertionPoint(branch.thenBlock()->getTerminator());
    write_empty_tile();
    e.b.setInsertionPoint(branch.elseBlock()->getTerminator());
    main_tile(n_begin, n_end);
  });
}

// The static_asserts of kernels/fa2/traits.cuh, as errors.
bool invariants_hold(const Shape &sh) {
  return sh.rows_per_warp % kMmaM == 0 && sh.m_blocks() >= 1 && sh.m_blocks() <= kMaxMBlocks &&
         sh.warps * kWarpSize == sh.threads && sh.warps * sh.rows_per_warp == sh.block_m &&
         sh.sub_block_n % kMmaK == 0 && sh.sub_block_n > 0 && sh.block_n % sh.sub_block_n == 0 &&
         (sh.ring() || sh.sub_blocks() == 1) && sh.head_dim_qk % kChunkElems == 0 && sh.head_dim_v % kChunkElems == 0 &&
         sh.head_dim_qk_pad % kMmaK == 0 && sh.head_dim_qk_pad >= sh.head_dim_qk &&
         (sh.head_dim_qk_pad == sh.head_dim_qk || sh.head_dim_qk_pad - sh.head_dim_qk == kChunkElems) &&
         sh.stride_q >= sh.head_dim_qk_pad && sh.stride_k >= sh.head_dim_qk_pad && sh.stride_v >= sh.head_dim_v &&
         sh.stride_o >= sh.head_dim_v && sh.stride_q % kChunkElems == 0 && sh.stride_k % kChunkElems == 0 &&
         sh.stride_v % kChunkElems == 0 && sh.stride_o % kChunkElems == 0 && sh.stages >= 1 && sh.page_size >= 0 &&
         (!sh.kv_stream() || (sh.threads >= sh.chunks_qk() && sh.threads >= sh.chunks_v())); // one KvStream row fits
}

} // namespace

std::string fa2_unsupported_reason(const KernelSpec &) {
  return "";
}

Status build_fa2(mlir::gpu::GPUModuleOp module, const KernelSpec &spec, const Plan &plan, BuiltKernel *out) {
  if (std::string why = fa2_unsupported_reason(spec); !why.empty())
    return Status::error(FLASHJIT_UNSUPPORTED, "fa2 (MLIR): " + why);
  Shape sh{};
  sh.dtype = spec.dtype == FLASHJIT_FP16 ? DType::fp16 : DType::bf16;
  sh.head_dim_qk = spec.head_dim_qk;
  sh.head_dim_v = spec.head_dim_v;
  sh.causal = spec.causal;
  sh.local = spec.local;
  sh.softcap = spec.softcap;
  sh.varlen = spec.varlen;
  sh.aligned16 = spec.align_bytes >= kChunkBytes;
  sh.page_size = spec.page_size;
  sh.threads = plan.threads;
  if (Status s = read_plan<int>("fa2", plan,
                                {
                                    {"kBlockM", &sh.block_m},
                                    {"kBlockN", &sh.block_n},
                                    {"kSubBlockN", &sh.sub_block_n},
                                    {"kStages", &sh.stages},
                                    {"kWarps", &sh.warps},
                                    {"kRowsPerWarp", &sh.rows_per_warp},
                                    {"kHeadDimQKPad", &sh.head_dim_qk_pad},
                                    {"kSmemStrideQ", &sh.stride_q},
                                    {"kSmemStrideK", &sh.stride_k},
                                    {"kSmemStrideV", &sh.stride_v},
                                    {"kSmemStrideO", &sh.stride_o},
                                    {"kSmemOffsetQ", &sh.offset_q},
                                    {"kSmemOffsetK", &sh.offset_k},
                                    {"kSmemOffsetV", &sh.offset_v},
                                    {"kSmemOffsetO", &sh.offset_o},
                                });
      !s)
    return s;
  if (!invariants_hold(sh))
    return Status::error(FLASHJIT_INTERNAL, "fa2: the plan's constants break the kernel's invariants");

  mlir::OpBuilder b(module.getContext());
  mlir::Location loc = b.getUnknownLoc();
  b.setInsertionPointToEnd(module.getBody());
  Emitter e{b, loc};
  mlir::LLVM::LLVMStructType params_type = attention_params_type(e);

  constexpr int kSmemAlign = 16; // extern __shared__ __align__(16) u8 smem[]
  const char *kSmemName = "fj_fa2_smem";
  extern_shared(e, kSmemName, kSmemAlign);

  const std::string entry = "fj_fa2_prefill";
  {
    mlir::OpBuilder::InsertionGuard guard(b);
    auto fn = kernel_func(e, entry, sh.threads);
    b.setInsertionPointToStart(&fn.getBody().front());
    const Params p = load_params(e, fn.getArgument(0), params_type);
    Value smem = mlir::LLVM::AddressOfOp::create(b, loc, e.ptr(kSharedSpace), kSmemName);
    Fa2Builder(e, sh, p, smem).build();
    mlir::gpu::ReturnOp::create(b, loc);
    if (Status s = layout_matches("fa2", fn, params_type, int(sizeof(fj_attention_params))); !s)
      return s;
  }
  // __launch_bounds__(kThreads, 1)
  *out = {entry, 0, params_type, int(sizeof(fj_attention_params)), 1};
  return Status::success();
}

} // namespace flashjit::mlirgen
