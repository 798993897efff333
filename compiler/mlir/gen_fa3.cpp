// The fa3 prefill kernel for sm_90a (templates/kernels/fa3_prefill.cuh + kernels/fa3/*.cuh) built
// with MLIR: entry fj_fa3_prefill, the fj_fa3_params block by value (__grid_constant__, so the four
// CUtensorMaps live in parameter space), __launch_bounds__(kThreads, 1). Warpgroup 0 is the
// producer (one thread issues every TMA load of Q, K, V into the kStages mbarrier ring, 128B
// swizzle); warpgroups 1..kConsumerWarpgroups are consumers (wgmma SS for S = Q K^T, online
// softmax, wgmma RS for O += P V with P in registers, intra-warpgroup overlap of QK_j with PV_{j-1},
// pingpong named barriers, epilogue through smem + TMA store + LSE). setmaxnreg moves registers
// from the producer to the consumers; the persistent scheduler walks the tiles in the template's
// snake order (heavy-first under causal masking). Every tile size, smem offset, swizzle, barrier id,
// descriptor field and register split is a plan constant (compiler/plans/fa3_plan.cpp).
//
// Layout of this file follows the template: plan constants (KernelConfig), parameter block, shared
// memory map, scheduler (scheduler.cuh), producer (producer.cuh), softmax (softmax.cuh), epilogue
// (epilogue.cuh), consumer (consumer.cuh), entry (fa3_prefill.cuh). Where LLVM would build a
// different kernel from the same IR than NVVM does, the IR says so: the parameter type is 64-byte
// aligned (tensor maps), parameters are read where used and thread-dependent epilogue / mask
// addresses are pinned next to their use (HopperEmitter::here), so LICM and speculation do not keep
// them live across the main loop (the d256 consumer would spill).
//
// Not covered: paged KV (the fa3 plan refuses it too). Covered and assembled without spills: bf16 /
// fp16, every head dim the plan takes (multiples of 8 in 32..256, qk != v), causal, sliding window,
// softcap, varlen, GQA, LSE, lengths that are not tile multiples (those are runtime values).
#include "compiler/mlir/emit_hopper.hpp"
#include "compiler/mlir/emit_mma.hpp"
#include "compiler/mlir/generators.hpp"

#include "exp2_poly.h"
#include "params_fa3.h"

#include "mlir/Interfaces/DataLayoutInterfaces.h"

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace flashjit::mlirgen {
namespace {

using mlir::Value;
using mlir::ValueRange;
namespace scf = mlir::scf;
using Pred = mlir::arith::CmpIPredicate;
using Values = std::vector<Value>;

constexpr int kRowsPerThread = 2; // rows lane/4 and lane/4 + 8 of the warp's 16
constexpr int kRowHalf = 8;       // the second row of a thread is 8 rows below the first
constexpr int kAccPerGroup = 4;   // accumulator registers per 8-column group
constexpr int kColsPerGroup = 8;
constexpr int kRowsPerWarp = 16;
constexpr int kQuadLanes = 4;
// kChunkBytes / kChunkElems (emit_mma.hpp): one 128B-swizzle chunk, wgmma's K-major LBO unit
constexpr int kSwizzleRows = 8;     // the 128B swizzle XORs the chunk index with row % 8
constexpr int kFragsPerKStep = 4;   // RS A-fragment registers per k-step
constexpr int kMatrixRows = 8;      // stmatrix m8n8
constexpr int kPingpongParties = 2; // bar.sync of one warpgroup + bar.arrive of the previous one
constexpr int kTransposeNone = 0;   // B K-major (K of S = Q K^T)
constexpr int kTransposeB = 1;      // B MN-major (V stored [token][dim])

// --- plan constants (the KernelConfig of the NVRTC build) -----------------------------------------

struct Config {
  DType dtype;
  int head_dim_qk, head_dim_v, threads;
  bool causal, local, softcap, varlen;
  int block_m, block_n, stages, consumer_wgs, regs_producer, regs_consumer, k_steps_qk, k_steps_pv, panel_cols,
      panels_qk, panels_v, swizzle_bytes, wgmma_swizzle, tma_box_rows, smem_align, smem_offset_q, smem_panel_bytes_q,
      smem_offset_o, smem_offset_k, smem_stage_bytes_k, smem_offset_v, smem_stage_bytes_v, smem_panel_bytes_kv,
      smem_offset_barriers, tx_bytes_q, tx_bytes_k, tx_bytes_v, barrier_pingpong, barrier_epilogue, exp2_poly_every,
      row_max_partials;
  bool pingpong, separate_o, rescale_before_pv, unmasked_key_loop;
  // Derived as the template derives them.
  int elem_bytes() const { return swizzle_bytes / panel_cols; }
  int k_step_bytes() const { return kWgmmaK * elem_bytes(); } // 16 elements of a K-major row
  int k_steps_per_panel() const { return panel_cols / kWgmmaK; }
  int swizzle_atom_bytes() const { return smem_align; } // 8 rows x 128 B; tiles start on it
  int s_regs() const { return block_n / 2; }
  int frag_regs() const { return block_n / 4; }
  int o_regs() const { return head_dim_v / 2; }
};

Status read_config(const KernelSpec &spec, const Plan &plan, Config *c) {
  c->dtype = spec.dtype == FLASHJIT_FP16 ? DType::fp16 : DType::bf16;
  c->head_dim_qk = spec.head_dim_qk;
  c->head_dim_v = spec.head_dim_v;
  c->threads = plan.threads;
  c->causal = spec.causal;
  c->local = spec.local;
  c->softcap = spec.softcap;
  c->varlen = spec.varlen;
  if (Status s = read_plan<int>("fa3 (MLIR)", plan,
                                {
                                    {"kBlockM", &c->block_m},
                                    {"kBlockN", &c->block_n},
                                    {"kStages", &c->stages},
                                    {"kConsumerWarpgroups", &c->consumer_wgs},
                                    {"kRegsProducer", &c->regs_producer},
                                    {"kRegsConsumer", &c->regs_consumer},
                                    {"kKStepsQK", &c->k_steps_qk},
                                    {"kKStepsPV", &c->k_steps_pv},
                                    {"kPanelCols", &c->panel_cols},
                                    {"kPanelsQK", &c->panels_qk},
                                    {"kPanelsV", &c->panels_v},
                                    {"kSwizzleBytes", &c->swizzle_bytes},
                                    {"kWgmmaSwizzle", &c->wgmma_swizzle},
                                    {"kTmaBoxRows", &c->tma_box_rows},
                                    {"kSmemAlign", &c->smem_align},
                                    {"kSmemOffsetQ", &c->smem_offset_q},
                                    {"kSmemPanelBytesQ", &c->smem_panel_bytes_q},
                                    {"kSmemOffsetO", &c->smem_offset_o},
                                    {"kSmemOffsetK", &c->smem_offset_k},
                                    {"kSmemStageBytesK", &c->smem_stage_bytes_k},
                                    {"kSmemOffsetV", &c->smem_offset_v},
                                    {"kSmemStageBytesV", &c->smem_stage_bytes_v},
                                    {"kSmemPanelBytesKV", &c->smem_panel_bytes_kv},
                                    {"kSmemOffsetBarriers", &c->smem_offset_barriers},
                                    {"kTxBytesQ", &c->tx_bytes_q},
                                    {"kTxBytesK", &c->tx_bytes_k},
                                    {"kTxBytesV", &c->tx_bytes_v},
                                    {"kBarrierPingpong", &c->barrier_pingpong},
                                    {"kBarrierEpilogue", &c->barrier_epilogue},
                                    {"kExp2PolyEvery", &c->exp2_poly_every},
                                    {"kRowMaxPartials", &c->row_max_partials},
                                });
      !s)
    return s;
  if (Status s = read_plan<bool>("fa3 (MLIR)", plan,
                                 {{"kPingpong", &c->pingpong},
                                  {"kSeparateO", &c->separate_o},
                                  {"kRescaleBeforePv", &c->rescale_before_pv},
                                  {"kUnmaskedKeyLoop", &c->unmasked_key_loop}});
      !s)
    return s;
  // Plan features the template renders and this generator does not: what each is, and what an
  // MLIR-backend plan has instead.
  struct TemplateOnly {
    const char *constant, *feature, *instead;
  };
  for (const TemplateOnly &t : {TemplateOnly{"kCrossTileOverlap", "cross-tile overlap", "one tile at a time"},
                                TemplateOnly{"kTailSplit", "tail split", "whole tiles"},
                                TemplateOnly{"kDynamicTiles", "dynamic-tiles", "the snake's static walk"},
                                TemplateOnly{"kFirstBlockInLoop", "first-block-in-loop", "a prologue block"},
                                TemplateOnly{"kProgrammaticLaunch", "programmatic-launch", "an ordinary launch"},
                                TemplateOnly{"kLazyRescale", "lazy-rescale", "eager rescaling"}})
    if (plan.constant(t.constant, 0) != 0)
      return Status::error(FLASHJIT_UNSUPPORTED, std::string("fa3 (MLIR): ") + t.feature + " plans (" + t.constant +
                                                     ") have a template form only; plan with the MLIR backend "
                                                     "(FLASHJIT_BACKEND_MLIR) for " +
                                                     t.instead);
  if (plan.cluster_m != 1 || plan.constant("kClusterM", 1) != 1)
    return Status::error(FLASHJIT_UNSUPPORTED, "fa3 (MLIR): CTA-pair (cluster) plans have a template form only; plan "
                                               "with the MLIR backend (FLASHJIT_BACKEND_MLIR) for single-CTA tiles");
  // The static_asserts of fa3_prefill.cuh / consumer.cuh, as errors.
  if (c->threads != kWarpgroupThreads * (1 + c->consumer_wgs) || c->block_m != kWgmmaM * c->consumer_wgs ||
      c->block_n % kWgmmaK != 0 || c->head_dim_v % kColsPerGroup != 0 || c->k_steps_pv * kWgmmaK != c->block_n ||
      c->panel_cols % kWgmmaK != 0 || c->block_m % c->tma_box_rows != 0 || c->stages < 1 || c->row_max_partials < 1 ||
      (c->row_max_partials & (c->row_max_partials - 1)) != 0 || c->row_max_partials > c->block_n / kColsPerGroup ||
      (c->unmasked_key_loop && (c->causal || c->local)))
    return Status::error(FLASHJIT_INTERNAL, "fa3 (MLIR): the plan's constants break the kernel's invariants");
  return Status::success();
}

// --- parameter block ----------------------------------------------------------------------------

enum Fa3Field { kBase, kTmaQ, kTmaK, kTmaV, kTmaO, kNumTiles, kHeadsPerSection };
constexpr int kTensorMapBytes = 128;
constexpr int kTensorMapAlign = 64; // fj_tensor_map is alignas(64): TMA reads a 64-byte aligned map
constexpr int kAttnBytes = 272;     // sizeof(fj_attention_params)
constexpr int kMapsOffset = 320;    // offsetof(fj_fa3_params, tma_q): 272 rounded up to 64
constexpr int kParamsBytes = 896;   // sizeof(fj_fa3_params): 840 rounded up to the 64-byte alignment
static_assert(sizeof(fj_attention_params) == kAttnBytes && offsetof(fj_fa3_params, tma_q) == kMapsOffset &&
                  offsetof(fj_fa3_params, tma_o) == kMapsOffset + 3 * kTensorMapBytes &&
                  offsetof(fj_fa3_params, num_tiles) == kMapsOffset + 4 * kTensorMapBytes &&
                  offsetof(fj_fa3_params, heads_per_section) == offsetof(fj_fa3_params, num_tiles) + 4 &&
                  sizeof(fj_fa3_params) == kParamsBytes && sizeof(fj_tensor_map) == kTensorMapBytes &&
                  alignof(fj_fa3_params) == kTensorMapAlign,
              "fa3_params_type below mirrors templates/params_fa3.h field for field");

// A tensor map is two 64-byte vectors: LLVM aligns them (and so the struct, its padding and the
// by-value parameter, `.param .align 64`) to 64 bytes as the C struct's alignas(64) does. With an
// 8-byte aligned parameter the maps would sit at a constant-bank offset that is not a multiple of 64.
mlir::LLVM::LLVMStructType fa3_params_type(Emitter &e) {
  mlir::MLIRContext *c = e.b.getContext();
  mlir::Type i64 = e.i64(), i32 = e.i32();
  auto attn = attention_params_type(e);
  constexpr int kWordsPerHalf = kTensorMapAlign / int(sizeof(uint64_t));
  auto half = mlir::VectorType::get({kWordsPerHalf}, i64);
  auto map = mlir::LLVM::LLVMArrayType::get(half, kTensorMapBytes / kTensorMapAlign);
  return mlir::LLVM::LLVMStructType::getLiteral(c, {attn, map, map, map, map, i32, i32});
}

mlir::LLVM::GEPOp field_address(Emitter &e, Value params, mlir::LLVM::LLVMStructType type,
                                std::initializer_list<int> path) {
  llvm::SmallVector<mlir::LLVM::GEPArg> indices{0};
  for (int i : path)
    indices.push_back(i);
  return mlir::LLVM::GEPOp::create(e.b, e.loc, e.ptr(), type, params, indices);
}

// The parameter block. Fields are read where they are used (ld.param from the constant bank, cheap),
// as the template does: loaded once up front they would hold registers across the whole tile loop.
struct Params {
  Emitter &e;
  Value self; // generic address of the by-value block (tensor maps are taken from it)
  mlir::LLVM::LLVMStructType type;
  Value at(std::initializer_list<int> path) const { return param_at(e, self, type, path); }
  Value base(AttnField f) const { return at({kBase, f}); }
  Value batch() const { return base(kBatch); }
  Value seqlen_q() const { return base(kSeqlenQ); }
  Value seqlen_k() const { return base(kSeqlenK); }
  Value total_q() const { return base(kTotalQ); }
  Value heads_q() const { return base(kHeadsQ); }
  Value group() const { return base(kGroup); }
  Value window_left() const { return base(kWindowLeft); }
  Value window_right() const { return base(kWindowRight); }
  Value num_m_blocks() const { return base(kNumMBlocks); }
  Value cu_q() const { return base(kCuQ); }
  Value cu_k() const { return base(kCuK); }
  Value num_tiles() const { return at({kNumTiles}); }
  Value heads_per_section() const { return at({kHeadsPerSection}); }
  // &params.tma_*: generic address in parameter space
  Value map(int which) const { return field_address(e, self, type, {which}); }
};

// --- control flow helpers -------------------------------------------------------------------------

llvm::SmallVector<mlir::Type> types_of(const Values &values) {
  llvm::SmallVector<mlir::Type> types;
  for (Value v : values)
    types.push_back(v.getType());
  return types;
}

// scf.if with results: `then_body` returns the values of the taken branch, `otherwise` those of the other.
Values if_else(Emitter &e, Value cond, const Values &otherwise, const std::function<Values()> &then_body) {
  auto op = scf::IfOp::create(e.b, e.loc, types_of(otherwise), cond, /*withElseRegion=*/true);
  {
    mlir::OpBuilder::InsertionGuard guard(e.b);
    e.b.setInsertionPointToStart(op.thenBlock());
    scf::YieldOp::create(e.b, e.loc, then_body());
    e.b.setInsertionPointToStart(op.elseBlock());
    scf::YieldOp::create(e.b, e.loc, otherwise);
  }
  return Values(op.getResults().begin(), op.getResults().end());
}

// for (i = lo; i < hi; i += step) with loop-carried `init`; `body(i, carried)` returns the next values.
Values for_loop(Emitter &e, Value lo, Value hi, Value step, const Values &init,
                const std::function<Values(Value, const Values &)> &body) {
  auto op = scf::ForOp::create(e.b, e.loc, lo, hi, step, init,
                               [&](mlir::OpBuilder &, mlir::Location, Value i, ValueRange carried) {
                                 scf::YieldOp::create(e.b, e.loc, body(i, Values(carried.begin(), carried.end())));
                               });
  return Values(op.getResults().begin(), op.getResults().end());
}

Values concat(std::initializer_list<const Values *> parts) {
  Values all;
  for (const Values *p : parts)
    all.insert(all.end(), p->begin(), p->end());
  return all;
}
Values slice(const Values &v, size_t at, size_t count) {
  return Values(v.begin() + at, v.begin() + at + count);
}

// --- shared memory map (smem.cuh) ----------------------------------------------------------------

struct Smem {
  HopperEmitter &e;
  const Config &c;
  Value base; // shared-window address, aligned to kSmemAlign
  enum : int { kBarrierBytes = 8, kQFull = 0, kQEmpty = 1, kKFull = 2 };
  int k_empty_index() const { return kKFull + c.stages; }
  int v_full_index() const { return k_empty_index() + c.stages; }
  int v_empty_index() const { return v_full_index() + c.stages; }

  Value at(int offset) const { return e.add(base, e.c_i32(offset)); }
  Value barrier(int index) const { return at(c.smem_offset_barriers + index * kBarrierBytes); }
  Value barrier(int first, Value stage) const { return e.add(barrier(first), e.mul(stage, e.c_i32(kBarrierBytes))); }
  Value q_full() const { return barrier(kQFull); }
  Value q_empty() const { return barrier(kQEmpty); }
  Value k_full(Value stage) const { return barrier(kKFull, stage); }
  Value k_empty(Value stage) const { return barrier(k_empty_index(), stage); }
  Value v_full(Value stage) const { return barrier(v_full_index(), stage); }
  Value v_empty(Value stage) const { return barrier(v_empty_index(), stage); }
  Value q_panel(int panel) const { return at(c.smem_offset_q + panel * c.smem_panel_bytes_q); }
  Value o_panel(Value panel) const { return e.add(at(c.smem_offset_o), e.mul(panel, e.c_i32(c.smem_panel_bytes_q))); }
  Value o_panel(int panel) const { return at(c.smem_offset_o + panel * c.smem_panel_bytes_q); }
  Value k_panel(Value stage, int panel) const {
    return e.add(at(c.smem_offset_k + panel * c.smem_panel_bytes_kv), e.mul(stage, e.c_i32(c.smem_stage_bytes_k)));
  }
  Value v_stage(Value stage) const { return e.add(at(c.smem_offset_v), e.mul(stage, e.c_i32(c.smem_stage_bytes_v))); }
};

// RingSlot: the stage and fill-phase parity of the i-th KV block a CTA processes.
struct RingSlot {
  Value stage, phase;
  static RingSlot at(HopperEmitter &e, const Config &c, Value block_index) {
    return {e.rem_u(block_index, e.c_i32(c.stages)), e.and_(e.div_u(block_index, e.c_i32(c.stages)), e.c_i32(1))};
  }
};

// --- scheduler (scheduler.cuh) -------------------------------------------------------------------

// Tile index of wave `wave` for this CTA: a snake over the CTAs.
Value snake_tile(HopperEmitter &e, Value wave) {
  Value grid = e.nctaid_x();
  Value cta = e.ctaid_x();
  Value odd = e.cmp(Pred::ne, e.and_(wave, e.c_i32(1)), e.c_i32(0));
  Value lane_in_wave = e.select(odd, e.sub(e.sub(grid, e.c_i32(1)), cta), cta);
  return e.add(e.mul(wave, grid), lane_in_wave);
}

// Waves of the persistent loop: while wave * gridDim.x < num_tiles.
Value wave_count(HopperEmitter &e, const Params &p) {
  Value grid = e.nctaid_x();
  return e.div_s(e.add(p.num_tiles(), e.sub(grid, e.c_i32(1))), grid);
}

struct Window {
  Value offset, left, right, has_left, has_right; // has_*: i1
};

struct Tile {
  Value batch, head, kv_head, m_block, seqlen_q, seqlen_k, q_row0, k_row0, batch_coord, n_min, n_max, has_rows;
};

Window make_window(HopperEmitter &e, const Config &c, const Params &p, Value seqlen_q, Value seqlen_k) {
  Window w;
  w.offset = e.sub(seqlen_k, seqlen_q);
  Value right_set = c.local ? e.cmp(Pred::sge, p.window_right(), e.c_i32(0)) : e.c_bool(false);
  w.has_right = c.causal ? e.c_bool(true) : right_set;
  w.right = c.causal ? e.c_i32(0) : p.window_right(); // causal = window (left, 0)
  w.has_left = c.local ? e.cmp(Pred::sge, p.window_left(), e.c_i32(0)) : e.c_bool(false);
  w.left = p.window_left();
  return w;
}
bool may_have_right(const Config &c) {
  return c.causal || c.local;
}
bool may_have_left(const Config &c) {
  return c.local;
}

Tile decode_tile(HopperEmitter &e, const Config &c, const Params &p, Value index) {
  Value m_blocks = p.num_m_blocks();
  Value pairs = e.mul(p.batch(), p.heads_q());
  Value section_pairs = p.heads_per_section();
  Value section = e.div_s(index, e.mul(m_blocks, section_pairs));
  Value rest = e.sub(index, e.mul(e.mul(section, m_blocks), section_pairs));
  Value pairs_here = e.min_s(section_pairs, e.sub(pairs, e.mul(section, section_pairs)));
  Value m_order = e.div_s(rest, pairs_here);
  Value pair = e.add(e.mul(section, section_pairs), e.sub(rest, e.mul(m_order, pairs_here)));

  Tile t;
  t.batch = e.div_s(pair, p.heads_q());
  t.head = e.sub(pair, e.mul(t.batch, p.heads_q()));
  t.kv_head = e.div_s(t.head, p.group());
  t.m_block = c.causal ? e.sub(e.sub(m_blocks, e.c_i32(1)), m_order) : m_order;
  if (c.varlen) {
    Value b64 = e.sext64(t.batch);
    Value next = e.add(b64, e.c_i64(1));
    t.q_row0 = e.ld_global_nc_s32(e.gep(p.cu_q(), e.i32(), b64));
    t.k_row0 = e.ld_global_nc_s32(e.gep(p.cu_k(), e.i32(), b64));
    t.seqlen_q = e.sub(e.ld_global_nc_s32(e.gep(p.cu_q(), e.i32(), next)), t.q_row0);
    t.seqlen_k = e.sub(e.ld_global_nc_s32(e.gep(p.cu_k(), e.i32(), next)), t.k_row0);
    t.batch_coord = e.c_i32(0);
  } else {
    t.q_row0 = e.c_i32(0);
    t.k_row0 = e.c_i32(0);
    t.seqlen_q = p.seqlen_q();
    t.seqlen_k = p.seqlen_k();
    t.batch_coord = t.batch;
  }
  Value row_lo = e.mul(t.m_block, e.c_i32(c.block_m));
  t.has_rows = e.cmp(Pred::slt, row_lo, t.seqlen_q);
  Value row_hi = e.sub(e.min_s(e.add(row_lo, e.c_i32(c.block_m)), t.seqlen_q), e.c_i32(1));
  const Window w = make_window(e, c, p, t.seqlen_q, t.seqlen_k);
  t.n_max = e.div_s(e.add(t.seqlen_k, e.c_i32(c.block_n - 1)), e.c_i32(c.block_n));
  t.n_min = e.c_i32(0);
  if (may_have_right(c)) {
    Value last_col = e.add(e.add(row_hi, w.offset), w.right); // highest visible column of the tile
    Value limit = e.select(e.cmp(Pred::slt, last_col, e.c_i32(0)), e.c_i32(0),
                           e.add(e.div_s(last_col, e.c_i32(c.block_n)), e.c_i32(1)));
    t.n_max = e.select(w.has_right, e.min_s(t.n_max, limit), t.n_max);
  }
  if (may_have_left(c)) {
    Value first_col = e.sub(e.add(row_lo, w.offset), w.left);
    Value n_min = e.select(e.cmp(Pred::sle, first_col, e.c_i32(0)), e.c_i32(0), e.div_s(first_col, e.c_i32(c.block_n)));
    t.n_min = e.select(w.has_left, n_min, t.n_min);
  }
  return t;
}

// True when some element of block n may be invisible to some row of the tile.
Value block_needs_mask(HopperEmitter &e, const Config &c, const Tile &t, const Window &w, Value n) {
  Value col_lo = e.mul(n, e.c_i32(c.block_n));
  Value col_hi = e.add(col_lo, e.c_i32(c.block_n - 1));
  Value row_lo = e.mul(t.m_block, e.c_i32(c.block_m));
  Value row_hi = e.add(row_lo, e.c_i32(c.block_m - 1));
  Value mask = e.cmp(Pred::sge, col_hi, t.seqlen_k);
  if (may_have_right(c))
    mask = e.or_i1(mask, e.and_(w.has_right, e.cmp(Pred::sgt, col_hi, e.add(e.add(row_lo, w.offset), w.right))));
  if (may_have_left(c))
    mask = e.or_i1(mask, e.and_(w.has_left, e.cmp(Pred::slt, col_lo, e.sub(e.add(row_hi, w.offset), w.left))));
  return mask;
}

// The tile loop both roles walk: for each wave's tile that has rows and at least one visible KV
// block, `body(t, carried)`; `empty(t)` for a tile with rows but no visible block. Carried: the
// ring position and the Q phase parity.
void for_each_tile(HopperEmitter &e, const Config &c, const Params &p, const Values &init,
                   const std::function<Values(const Tile &, const Values &)> &body,
                   const std::function<void(const Tile &)> &empty) {
  for_loop(e, e.c_i32(0), wave_count(e, p), e.c_i32(1), init, [&](Value wave, const Values &carried) {
    Value index = snake_tile(e, wave);
    return if_else(e, e.cmp(Pred::slt, index, p.num_tiles()), carried, [&] {
      const Tile t = decode_tile(e, c, p, index);
      return if_else(e, t.has_rows, carried, [&] {
        Value has_blocks = e.cmp(Pred::sgt, t.n_max, t.n_min);
        if (!empty)
          return if_else(e, has_blocks, carried, [&] { return body(t, carried); });
        auto op = scf::IfOp::create(e.b, e.loc, types_of(carried), has_blocks, /*withElseRegion=*/true);
        {
          mlir::OpBuilder::InsertionGuard guard(e.b);
          e.b.setInsertionPointToStart(op.thenBlock());
          scf::YieldOp::create(e.b, e.loc, body(t, carried));
          e.b.setInsertionPointToStart(op.elseBlock());
          empty(t);
          scf::YieldOp::create(e.b, e.loc, carried);
        }
        return Values(op.getResults().begin(), op.getResults().end());
      });
    });
  });
}

// --- producer (producer.cuh) ---------------------------------------------------------------------

struct Producer {
  HopperEmitter &e;
  const Config &c;
  const Params &p;
  const Smem &smem;
  Value keep_policy, stream_policy;

  void load_kv(Value map, Value full_bar, Value empty_bar, Value phase, int tx_bytes, Value dst, int panels,
               int col_step, const Tile &t, Value n) {
    e.mbarrier_wait_parity(empty_bar, e.xor_(phase, e.c_i32(1)));
    e.mbarrier_arrive_expect_tx(full_bar, e.c_i32(tx_bytes));
    Value row = e.add(t.k_row0, e.mul(n, e.c_i32(c.block_n)));
    for (int panel = 0; panel < panels; ++panel)
      e.tma_load_4d(e.add(dst, e.c_i32(panel * c.smem_panel_bytes_kv)), map, full_bar, e.c_i32(panel * col_step), row,
                    t.kv_head, t.batch_coord, keep_policy);
  }
  void load_k(const Tile &t, Value n, Value block_index) {
    const RingSlot slot = RingSlot::at(e, c, block_index);
    load_kv(p.map(kTmaK), smem.k_full(slot.stage), smem.k_empty(slot.stage), slot.phase, c.tx_bytes_k,
            smem.k_panel(slot.stage, 0), c.panels_qk, c.panel_cols, t, n);
  }
  void load_v(const Tile &t, Value n, Value block_index) {
    const RingSlot slot = RingSlot::at(e, c, block_index);
    load_kv(p.map(kTmaV), smem.v_full(slot.stage), smem.v_empty(slot.stage), slot.phase, c.tx_bytes_v,
            smem.v_stage(slot.stage), c.panels_v, c.panel_cols, t, n);
  }
  void load_q(const Tile &t, Value tile_parity) {
    const int boxes_per_panel = c.block_m / c.tma_box_rows;
    e.mbarrier_wait_parity(smem.q_empty(), e.xor_(tile_parity, e.c_i32(1)));
    e.mbarrier_arrive_expect_tx(smem.q_full(), e.c_i32(c.tx_bytes_q));
    Value row = e.add(t.q_row0, e.mul(t.m_block, e.c_i32(c.block_m)));
    for (int panel = 0; panel < c.panels_qk; ++panel)
      for (int box = 0; box < boxes_per_panel; ++box)
        e.tma_load_4d(e.add(smem.q_panel(panel), e.c_i32(box * c.tma_box_rows * c.swizzle_bytes)), p.map(kTmaQ),
                      smem.q_full(), e.c_i32(panel * c.panel_cols), e.add(row, e.c_i32(box * c.tma_box_rows)), t.head,
                      t.batch_coord, stream_policy);
  }

  void run() {
    for_each_tile(
        e, c, p, {e.c_i32(0), e.c_i32(0)},
        [&](const Tile &t, const Values &carried) -> Values {
          Value block_index = carried[0], tile_parity = carried[1];
          Value n = e.sub(t.n_max, e.c_i32(1));
          load_k(t, n, block_index);
          load_q(t, tile_parity);
          load_v(t, n, block_index);
          Value first = e.add(block_index, e.c_i32(1));
          // for (--n; n >= n_min; --n): iteration i loads block n_max - 2 - i
          Values after =
              for_loop(e, e.c_i32(0), e.sub(n, t.n_min), e.c_i32(1), {first}, [&](Value i, const Values &bi) {
                Value block = e.sub(e.sub(n, e.c_i32(1)), i);
                load_k(t, block, bi[0]);
                load_v(t, block, bi[0]);
                return Values{e.add(bi[0], e.c_i32(1))};
              });
          return {after[0], e.xor_(tile_parity, e.c_i32(1))};
        },
        nullptr); // the consumers write O = 0 / LSE = -inf without touching smem
  }
};

// --- softmax (softmax.cuh) -----------------------------------------------------------------------

struct RowState {
  Values max, sum; // kRowsPerThread each: running max of raw logits (-inf before any key), partial sum
};

// 2^x on the FMA/ALU pipes for x <= 0: the polynomial of exp2_poly.h, as softmax.cuh evaluates it.
Value exp2_poly3(HopperEmitter &e, Value x) {
  using namespace fj_exp2_poly;
  x = e.max_f32(x, e.c_f32(kMinExponent));
  Value rounded = e.fadd(x, e.c_f32(kRoundMagic));
  Value f = e.fsub(x, e.fsub(rounded, e.c_f32(kRoundMagic)));
  Value poly =
      e.fadd(e.fmul(e.fadd(e.fmul(e.fadd(e.fmul(e.c_f32(kC3), f), e.c_f32(kC2)), f), e.c_f32(kC1)), f), e.c_f32(kC0));
  Value bits = mlir::arith::BitcastOp::create(e.b, e.loc, e.i32(), rounded);
  Value exponent = e.add(e.shl(bits, e.c_i32(kMantissaBits)), e.c_i32(int64_t(kExponentBias) << kMantissaBits));
  return e.fmul(poly, mlir::arith::BitcastOp::create(e.b, e.loc, e.f32(), exponent));
}

// tanh(x) = 1 - 2 / (2^(2x log2 e) + 1) (prim/math.cuh tanh_fast)
Value tanh_fast(HopperEmitter &e, Value x) {
  Value two_x_log2e = e.fmul(x, e.c_f32(2.0f * kLog2e));
  return e.fsub(e.c_f32(1.0f), e.fmul(e.c_f32(2.0f), e.rcp_approx(e.fadd(e.ex2_approx(two_x_log2e), e.c_f32(1.0f)))));
}

// Sets invisible logits to -inf; row0 is the thread's first row in the sequence, col0 the column of s[0].
void apply_mask(HopperEmitter &e, const Config &c, Values &s, Value row0, Value col0, const Tile &t, const Window &w) {
  for (int r = 0; r < kRowsPerThread; ++r) {
    Value row = e.add(row0, e.c_i32(r * kRowHalf));
    Value col_end = t.seqlen_k; // exclusive
    if (may_have_right(c))
      col_end =
          e.select(w.has_right, e.min_s(col_end, e.add(e.add(e.add(row, w.offset), w.right), e.c_i32(1))), col_end);
    Value col_begin =
        may_have_left(c) ? e.select(w.has_left, e.sub(e.add(row, w.offset), w.left), e.c_i32(0)) : Value{};
    // Column col0 + k is hidden when k >= col_end - col0 or k < col_begin - col0: two values per
    // row instead of one register per column (LLVM would keep kBlockN/2 column values live).
    Value end_rel = e.sub(col_end, col0);
    Value begin_rel = col_begin ? e.sub(col_begin, col0) : Value{};
    for (int j = 0; j < c.block_n / kColsPerGroup; ++j)
      for (int el = 0; el < 2; ++el) {
        Value k = e.c_i32(j * kColsPerGroup + el);
        Value hidden = e.cmp(Pred::sle, end_rel, k);
        if (begin_rel) // without a left window every column is >= 0 = col_begin
          hidden = e.or_i1(hidden, e.cmp(Pred::sgt, begin_rel, k));
        Value &x = s[j * kAccPerGroup + r * 2 + el];
        x = e.select(hidden, e.neg_inf(), x);
      }
  }
}

// One online-softmax step: new row max, the factor for the old O and sum, s -> p, row sums.
Values softmax_step(HopperEmitter &e, const Config &c, Values &s, RowState &st, Value scale_log2) {
  Values rescale(kRowsPerThread);
  for (int r = 0; r < kRowsPerThread; ++r) {
    // kRowMaxPartials running maxima over interleaved column groups, combined by a tree.
    const int partials = c.row_max_partials;
    Values partial(partials);
    for (int j = 0; j < c.block_n / kColsPerGroup; ++j) {
      Value pair = e.max_f32(s[j * kAccPerGroup + r * 2], s[j * kAccPerGroup + r * 2 + 1]);
      partial[j % partials] = j < partials ? pair : e.max_f32(partial[j % partials], pair);
    }
    for (int width = 1; width < partials; width *= 2)
      for (int i = 0; i + width < partials; i += 2 * width)
        partial[i] = e.max_f32(partial[i], partial[i + width]);
    Value block_max = e.quad_reduce_max(e.max_f32(st.max[r], partial[0]));
    // A row that has seen no key keeps max = -inf; use 0 so that exp2 gives 0, not NaN.
    Value safe_max =
        e.select(e.cmpf(mlir::arith::CmpFPredicate::OEQ, block_max, e.neg_inf()), e.c_f32(0.0f), block_max);
    rescale[r] = e.ex2_approx(e.fmul(e.fsub(st.max[r], safe_max), scale_log2));
    st.max[r] = block_max;
    Value bias = e.fmul(e.fneg(safe_max), scale_log2);
    Value sum = e.c_f32(0.0f);
    for (int j = 0; j < c.block_n / kColsPerGroup; ++j)
      for (int el = 0; el < 2; ++el) {
        Value &x = s[j * kAccPerGroup + r * 2 + el];
        Value arg = e.fadd(e.fmul(x, scale_log2), bias); // contracted to one FFMA
        const int every = c.exp2_poly_every;
        x = (every > 0 && j % every == every - 1) ? exp2_poly3(e, arg) : e.ex2_approx(arg);
        sum = e.fadd(sum, x);
      }
    st.sum[r] = e.fadd(e.fmul(st.sum[r], rescale[r]), sum);
  }
  return rescale;
}

// --- epilogue (epilogue.cuh) ---------------------------------------------------------------------

struct Epilogue {
  HopperEmitter &e;
  const Config &c;
  const Params &p;
  const Smem &smem;
  Value wg, tid;

  Value o_field(TensorField f) const { return p.at({kBase, kO, f}); }
  Value lse_ptr() const { return p.base(kMaybeLse); }

  Value warp() const { return e.div_u(tid, e.c_i32(kWarpSize)); }
  Value lane() const { return e.rem_u(tid, e.c_i32(kWarpSize)); }

  Value o_row_ptr(const Tile &t, Value row_in_seq) const {
    Value row = e.sext64(e.add(t.q_row0, row_in_seq));
    Value elem = e.add(e.mul(row, o_field(kRowStride)), e.mul(e.sext64(t.head), o_field(kHeadStride)));
    if (!c.varlen)
      elem = e.add(elem, e.mul(e.sext64(t.batch), o_field(kBatchStride)));
    return e.gep(o_field(kPtr), e.b.getI16Type(), elem);
  }

  void write_lse(const Tile &t, Value row_in_seq, Value lse) const {
    Value lse_out = lse_ptr();
    Value ok = e.and_(e.not_(e.is_null(lse_out)), e.cmp(Pred::slt, row_in_seq, t.seqlen_q));
    when(e, ok, [&] {
      Value index = c.varlen
                        ? e.add(e.mul(e.sext64(t.head), e.sext64(p.total_q())), e.sext64(e.add(t.q_row0, row_in_seq)))
                        : e.add(e.mul(e.add(e.mul(e.sext64(t.batch), e.sext64(p.heads_q())), e.sext64(t.head)),
                                      e.sext64(p.seqlen_q())),
                                e.sext64(row_in_seq));
      e.st_global_f32(e.gep(lse_out, e.f32(), index), lse);
    });
  }

  // The epilogue's thread-dependent addresses are computed per tile (see HopperEmitter::here).
  Epilogue at_use() const { return Epilogue{e, c, p, smem, e.here(wg), e.here(tid)}; }

  // A tile none of whose rows sees a key: O = 0, LSE = -inf, straight to global memory.
  void write_empty(const Tile &t) const { at_use().write_empty_here(t); }
  void write_empty_here(const Tile &t) const {
    const int chunks = c.head_dim_v / kChunkElems;
    Value row_base = e.add(e.mul(t.m_block, e.c_i32(c.block_m)), e.mul(wg, e.c_i32(kWgmmaM)));
    for_loop(e, tid, e.c_i32(kWgmmaM * chunks), e.c_i32(kWarpgroupThreads), {}, [&](Value i, const Values &) {
      Value row = e.add(row_base, e.div_s(i, e.c_i32(chunks)));
      when(e, e.cmp(Pred::slt, row, t.seqlen_q), [&] {
        Value zero = e.c_i32(0);
        Value at = e.gep(o_row_ptr(t, row), e.b.getI8Type(), e.mul(e.rem_s(i, e.c_i32(chunks)), e.c_i32(kChunkBytes)));
        e.st_global_v4_b32(at, {zero, zero, zero, zero});
      });
      return Values{};
    });
    for_loop(e, tid, e.c_i32(kWgmmaM), e.c_i32(kWarpgroupThreads), {}, [&](Value i, const Values &) {
      write_lse(t, e.add(row_base, i), e.neg_inf());
      return Values{};
    });
  }

  // Address of (row, 16-byte chunk) in the panel-major 128B-swizzled O tile.
  Value swizzled_chunk(Value row, Value col) const {
    Value panel = e.div_u(col, e.c_i32(c.panel_cols));
    Value chunk = e.div_u(e.rem_u(col, e.c_i32(c.panel_cols)), e.c_i32(kChunkElems));
    Value swizzled = e.xor_(chunk, e.rem_u(row, e.c_i32(kSwizzleRows)));
    return e.add(e.add(smem.o_panel(panel), e.mul(row, e.c_i32(c.swizzle_bytes))),
                 e.mul(swizzled, e.c_i32(kChunkBytes)));
  }

  // O accumulators -> 16-bit, into this warpgroup's rows of the swizzled O panels (stmatrix).
  void stage_o(const Values &o) const {
    const int groups = c.head_dim_v / kColsPerGroup;
    Value lane_row = e.rem_u(lane(), e.c_i32(kMatrixRows));
    Value matrix = e.div_u(lane(), e.c_i32(kMatrixRows));
    Value row_base = e.add(e.add(e.mul(wg, e.c_i32(kWgmmaM)), e.mul(warp(), e.c_i32(kRowsPerWarp))), lane_row);
    Value row = e.add(row_base, e.mul(e.and_(matrix, e.c_i32(1)), e.c_i32(kRowHalf)));
    Value col_half = e.shr_u(matrix, e.c_i32(1));
    auto pack = [&](int i) { return e.pack2_from_f32(c.dtype, o[i], o[i + 1]); };
    for (int j = 0; j + 1 < groups; j += 2) {
      Value col = e.mul(e.add(e.c_i32(j), col_half), e.c_i32(kColsPerGroup));
      const int a = j * kAccPerGroup;
      e.stmatrix_x4(swizzled_chunk(row, col), pack(a), pack(a + 2), pack(a + 4), pack(a + 6));
    }
    if (groups % 2 == 1) {
      const int j = groups - 1;
      const int a = j * kAccPerGroup;
      e.stmatrix_x2(swizzled_chunk(row, e.c_i32(j * kColsPerGroup)), pack(a), pack(a + 2));
    }
  }

  void run(const Tile &t, const Values &o, const RowState &st, Value scale_log2) const {
    at_use().run_here(t, o, st, scale_log2);
  }
  void run_here(const Tile &t, Values o, const RowState &st, Value scale_log2) const {
    // Finish the row sums across the quad, normalize, and write the LSE (natural log).
    Value row0 = e.add(e.add(e.add(e.mul(t.m_block, e.c_i32(c.block_m)), e.mul(wg, e.c_i32(kWgmmaM))),
                             e.mul(warp(), e.c_i32(kRowsPerWarp))),
                       e.div_u(lane(), e.c_i32(kQuadLanes)));
    for (int r = 0; r < kRowsPerThread; ++r) {
      Value sum = e.quad_reduce_sum(st.sum[r]);
      Value positive = e.cmpf(mlir::arith::CmpFPredicate::OGT, sum, e.c_f32(0.0f));
      Value inv = e.select(positive, e.rcp_approx(sum), e.c_f32(0.0f));
      for (int j = 0; j < c.head_dim_v / kColsPerGroup; ++j) {
        o[j * kAccPerGroup + r * 2] = e.fmul(o[j * kAccPerGroup + r * 2], inv);
        o[j * kAccPerGroup + r * 2 + 1] = e.fmul(o[j * kAccPerGroup + r * 2 + 1], inv);
      }
      when(e, e.cmp(Pred::eq, e.rem_u(lane(), e.c_i32(kQuadLanes)), e.c_i32(0)), [&] {
        Value lse = e.select(positive, e.fmul(e.fadd(e.fmul(st.max[r], scale_log2), e.lg2_approx(sum)), e.c_f32(kLn2)),
                             e.neg_inf());
        write_lse(t, e.add(row0, e.c_i32(r * kRowHalf)), lse);
      });
    }

    Value epilogue_barrier = e.add(e.c_i32(c.barrier_epilogue), wg);
    Value first_thread = e.cmp(Pred::eq, tid, e.c_i32(0));
    if (c.separate_o) {
      // The previous tile's TMA store must have read the O panels before they are overwritten.
      when(e, first_thread, [&] { e.tma_store_wait(0, /*read_only=*/true); });
      e.named_barrier_sync(epilogue_barrier, kWarpgroupThreads);
    }
    stage_o(o);
    Value wg_row = e.add(e.mul(t.m_block, e.c_i32(c.block_m)), e.mul(wg, e.c_i32(kWgmmaM)));
    auto tma_store = [&] {
      e.fence_proxy_async_shared(); // stmatrix writes -> visible to the TMA engine
      e.named_barrier_sync(epilogue_barrier, kWarpgroupThreads);
      when(e, first_thread, [&] {
        for (int panel = 0; panel < c.panels_v; ++panel)
          e.tma_store_4d(p.map(kTmaO), e.add(smem.o_panel(panel), e.mul(wg, e.c_i32(kWgmmaM * c.swizzle_bytes))),
                         e.c_i32(panel * c.panel_cols), e.add(t.q_row0, wg_row), t.head, t.batch_coord);
        e.tma_store_commit_group();
        if (!c.separate_o) {
          e.tma_store_wait(0, /*read_only=*/true); // smem may be overwritten by the next Q once read
          e.mbarrier_arrive(smem.q_empty());
        }
      });
    };
    if (!c.varlen) {
      tma_store();
      return;
    }
    // Varlen: a warpgroup whose rows run past its sequence stores with predicated 16-byte stores
    // (the packed tensor's next rows belong to another sequence).
    Value whole = e.cmp(Pred::sle, e.add(wg_row, e.c_i32(kWgmmaM)), t.seqlen_q);
    auto op = scf::IfOp::create(e.b, e.loc, whole, /*withElseRegion=*/true);
    mlir::OpBuilder::InsertionGuard guard(e.b);
    e.b.setInsertionPoint(op.thenBlock()->getTerminator());
    tma_store();
    e.b.setInsertionPoint(op.elseBlock()->getTerminator());
    e.named_barrier_sync(epilogue_barrier, kWarpgroupThreads);
    const int chunks = c.head_dim_v / kChunkElems;
    for_loop(e, tid, e.c_i32(kWgmmaM * chunks), e.c_i32(kWarpgroupThreads), {}, [&](Value i, const Values &) {
      Value row = e.div_s(i, e.c_i32(chunks));
      Value chunk = e.rem_s(i, e.c_i32(chunks));
      when(e, e.cmp(Pred::slt, e.add(wg_row, row), t.seqlen_q), [&] {
        auto v = e.ld_shared_v4_b32(
            swizzled_chunk(e.add(e.mul(wg, e.c_i32(kWgmmaM)), row), e.mul(chunk, e.c_i32(kChunkElems))));
        e.st_global_v4_b32(e.gep(o_row_ptr(t, e.add(wg_row, row)), e.b.getI8Type(), e.mul(chunk, e.c_i32(kChunkBytes))),
                           v);
      });
      return Values{};
    });
    if (!c.separate_o) {
      e.fence_proxy_async_shared(); // our generic accesses before the next Q's TMA overwrite
      e.named_barrier_sync(epilogue_barrier, kWarpgroupThreads); // all smem reads done
      when(e, first_thread, [&] { e.mbarrier_arrive(smem.q_empty()); });
    }
  }
};

// --- consumer (consumer.cuh) ---------------------------------------------------------------------

struct Consumer {
  HopperEmitter &e;
  const Config &c;
  const Params &p;
  const Smem &smem;
  Value wg, tid; // consumer warpgroup (0-based, warp-uniform), thread inside it
  Value scale_log2, cap_pre, cap_post;

  void turn_wait() const {
    if (c.pingpong)
      e.named_barrier_sync(e.add(e.c_i32(c.barrier_pingpong), wg), kPingpongParties * kWarpgroupThreads);
  }
  void turn_pass() const {
    if (c.pingpong) {
      Value next = e.rem_u(e.add(wg, e.c_i32(1)), e.c_i32(c.consumer_wgs));
      e.named_barrier_arrive(e.add(e.c_i32(c.barrier_pingpong), next), kPingpongParties * kWarpgroupThreads);
    }
  }
  void release(Value empty_bar) const {
    // one arrival per warpgroup (count = kConsumerWarpgroups)
    when(e, e.cmp(Pred::eq, tid, e.c_i32(0)), [&] { e.mbarrier_arrive(empty_bar); });
  }
  // With a separate O region, Q is free once the tile's last QK (block n_min) has completed.
  void release_q_after_qk(const Tile &t, Value n) const {
    if (c.separate_o)
      when(e, e.cmp(Pred::eq, n, t.n_min), [&] { release(smem.q_empty()); });
  }

  Values issue_qk(Value stage) const {
    Values s;
    for (int k = 0; k < c.k_steps_qk; ++k) {
      const int panel = k / c.k_steps_per_panel();
      const int step = (k % c.k_steps_per_panel()) * c.k_step_bytes();
      Value a_addr = e.add(e.add(smem.q_panel(panel), e.mul(wg, e.c_i32(kWgmmaM * c.swizzle_bytes))), e.c_i32(step));
      Value a = e.wgmma_desc(a_addr, kChunkBytes, c.swizzle_atom_bytes(), c.wgmma_swizzle);
      Value b = e.wgmma_desc(e.add(smem.k_panel(stage, panel), e.c_i32(step)), kChunkBytes, c.swizzle_atom_bytes(),
                             c.wgmma_swizzle);
      s = e.wgmma_ss(c.block_n, c.dtype, kTransposeNone, s, a, b, /*accumulate=*/k > 0);
    }
    e.wgmma_commit_group();
    return s;
  }

  Values issue_pv(Values o, const Values &frag, Value stage) const {
    for (int k = 0; k < c.k_steps_pv; ++k) {
      Value b = e.wgmma_desc(e.add(smem.v_stage(stage), e.c_i32(k * kWgmmaK * c.swizzle_bytes)), c.smem_panel_bytes_kv,
                             c.swizzle_atom_bytes(), c.wgmma_swizzle);
      o = e.wgmma_rs(c.head_dim_v, c.dtype, kTransposeB, o,
                     {frag[k * kFragsPerKStep + 0], frag[k * kFragsPerKStep + 1], frag[k * kFragsPerKStep + 2],
                      frag[k * kFragsPerKStep + 3]},
                     b);
    }
    e.wgmma_commit_group();
    return o;
  }

  // S (f32, holding p) -> 16-bit pairs: columns 16k..16k+15 are the A fragment of k-step k.
  Values to_fragments(const Values &s) const {
    Values frag(c.frag_regs());
    for (int i = 0; i < c.frag_regs(); ++i)
      frag[i] = e.pack2_from_f32(c.dtype, s[2 * i], s[2 * i + 1]);
    return frag;
  }

  void rescale_o(Values &o, const Values &scale) const {
    for (int j = 0; j < c.head_dim_v / kColsPerGroup; ++j)
      for (int r = 0; r < kRowsPerThread; ++r) {
        o[j * kAccPerGroup + r * 2] = e.fmul(o[j * kAccPerGroup + r * 2], scale[r]);
        o[j * kAccPerGroup + r * 2 + 1] = e.fmul(o[j * kAccPerGroup + r * 2 + 1], scale[r]);
      }
  }

  // Mask / soft cap / online softmax of block n in s; returns the O rescale factors. may_mask false:
  // every key of the block is visible (kUnmaskedKeyLoop's key loop), so no mask code is emitted.
  Values softmax(Values &s, RowState &st, const Tile &t, const Window &w, Value n, bool may_mask = true) const {
    if (c.softcap)
      for (Value &x : s)
        x = e.fmul(cap_post, tanh_fast(e, e.fmul(x, cap_pre)));
    if (may_mask)
      s = if_else(e, block_needs_mask(e, c, t, w, n), s, [&] {
        Values masked = s;
        // The mask stays behind its branch: built from a value defined there (HopperEmitter::here),
        // LLVM cannot speculate it into per-element selects that every unmasked block would pay for.
        Value lane_tid = e.here(tid);
        Value row0 = e.add(e.add(e.add(e.mul(t.m_block, e.c_i32(c.block_m)), e.mul(wg, e.c_i32(kWgmmaM))),
                                 e.mul(e.div_u(lane_tid, e.c_i32(kWarpSize)), e.c_i32(kRowsPerWarp))),
                           e.div_u(e.rem_u(lane_tid, e.c_i32(kWarpSize)), e.c_i32(kQuadLanes)));
        Value col0 = e.add(e.mul(n, e.c_i32(c.block_n)), e.mul(e.c_i32(2), e.rem_u(lane_tid, e.c_i32(kQuadLanes))));
        apply_mask(e, c, masked, row0, col0, t, w);
        return masked;
      });
    return softmax_step(e, c, s, st, scale_log2);
  }

  void run(const Epilogue &epilogue) {
    const int o_regs = c.o_regs(), frag_regs = c.frag_regs();
    if (c.pingpong)
      when(e, e.cmp(Pred::eq, wg, e.c_i32(c.consumer_wgs - 1)), [&] { turn_pass(); }); // one turn token, at wg 0
    for_each_tile(
        e, c, p, {e.c_i32(0), e.c_i32(0)},
        [&](const Tile &t, const Values &carried) -> Values {
          Value block_index = carried[0], tile_parity = carried[1];
          const Window w = make_window(e, c, p, t.seqlen_q, t.seqlen_k);
          RowState st{Values(kRowsPerThread, e.neg_inf()), Values(kRowsPerThread, e.c_f32(0.0f))};
          Values o(o_regs, e.c_f32(0.0f));

          // Prologue: S for the last (possibly partial / diagonal) block.
          Value n = e.sub(t.n_max, e.c_i32(1));
          RingSlot cur = RingSlot::at(e, c, block_index);
          e.mbarrier_wait_parity(smem.q_full(), tile_parity);
          e.mbarrier_wait_parity(smem.k_full(cur.stage), cur.phase);
          turn_wait();
          e.wgmma_fence();
          Values s = issue_qk(cur.stage);
          turn_pass();
          e.wgmma_wait_group(0);
          e.wgmma_fence_operands(s);
          release(smem.k_empty(cur.stage));
          release_q_after_qk(t, n);
          Values scale = softmax(s, st, t, w, n);
          Values frag = to_fragments(s);

          // for (--n; n >= n_min; --n): iteration i handles block n_max - 2 - i; carried: O, P, row
          // state, [the rescale of the previous block], the ring position of the current block.
          const bool carry_scale = c.rescale_before_pv;
          Values init = concat({&o, &frag, &st.max, &st.sum});
          if (carry_scale)
            init.insert(init.end(), scale.begin(), scale.end());
          init.push_back(block_index);
          Values out = for_loop(e, e.c_i32(0), e.sub(n, t.n_min), e.c_i32(1), init, [&](Value i, const Values &v) {
            size_t at = 0;
            Values o = slice(v, at, o_regs);
            at += o_regs;
            Values frag = slice(v, at, frag_regs);
            at += frag_regs;
            RowState st{slice(v, at, kRowsPerThread), slice(v, at + kRowsPerThread, kRowsPerThread)};
            at += 2 * kRowsPerThread;
            Values scale = carry_scale ? slice(v, at, kRowsPerThread) : Values{};
            Value prev_index = v.back();
            Value n = e.sub(e.sub(t.n_max, e.c_i32(2)), i);
            const RingSlot prev = RingSlot::at(e, c, prev_index);
            Value cur_index = e.add(prev_index, e.c_i32(1));
            const RingSlot cur = RingSlot::at(e, c, cur_index);
            e.mbarrier_wait_parity(smem.k_full(cur.stage), cur.phase);
            turn_wait();
            e.wgmma_fence();
            Values s = issue_qk(cur.stage);
            if (c.rescale_before_pv)
              rescale_o(o, scale); // FMULs under the QK GEMM instead of after the PV wait
            e.mbarrier_wait_parity(smem.v_full(prev.stage), prev.phase);
            e.wgmma_fence(); // the V wait sits between the two GEMMs: re-fence the PV operands
            o = issue_pv(o, frag, prev.stage);
            turn_pass();
            e.wgmma_wait_group(1); // S_j ready; PV_{j-1} may still run
            e.wgmma_fence_operands(s);
            release(smem.k_empty(cur.stage));
            release_q_after_qk(t, n);
            scale = softmax(s, st, t, w, n, !c.unmasked_key_loop);
            e.wgmma_wait_group(0);
            e.wgmma_fence_operands(o);
            e.wgmma_fence_operands(frag);
            release(smem.v_empty(prev.stage));
            if (!c.rescale_before_pv)
              rescale_o(o, scale);
            frag = to_fragments(s);
            Values next = concat({&o, &frag, &st.max, &st.sum});
            if (carry_scale)
              next.insert(next.end(), scale.begin(), scale.end());
            next.push_back(cur_index);
            return next;
          });
          size_t at = 0;
          o = slice(out, at, o_regs);
          at += o_regs;
          frag = slice(out, at, frag_regs);
          at += frag_regs;
          st = RowState{slice(out, at, kRowsPerThread), slice(out, at + kRowsPerThread, kRowsPerThread)};
          at += 2 * kRowsPerThread;
          if (carry_scale)
            scale = slice(out, at, kRowsPerThread);
          Value last_index = out.back();
          cur = RingSlot::at(e, c, last_index);

          // Last PV.
          if (c.rescale_before_pv)
            rescale_o(o, scale);
          e.mbarrier_wait_parity(smem.v_full(cur.stage), cur.phase);
          turn_wait();
          e.wgmma_fence();
          o = issue_pv(o, frag, cur.stage);
          turn_pass();
          e.wgmma_wait_group(0);
          e.wgmma_fence_operands(o);
          release(smem.v_empty(cur.stage));

          epilogue.run(t, o, st, scale_log2);
          return {e.add(last_index, e.c_i32(1)), e.xor_(tile_parity, e.c_i32(1))};
        },
        [&](const Tile &t) { epilogue.write_empty(t); });
    if (c.pingpong) // absorb warpgroup 1's last hand-over so the barrier ends balanced
      when(e, e.cmp(Pred::eq, wg, e.c_i32(0)), [&] { turn_wait(); });
    when(e, e.cmp(Pred::eq, tid, e.c_i32(0)), [&] { e.tma_store_wait(0, /*read_only=*/false); });
  }
};

} // namespace

std::string fa3_unsupported_reason(const KernelSpec &spec) {
  if (spec.page_size > 0)
    return "paged KV (page_size " + std::to_string(spec.page_size) + ")";
  return "";
}

Status build_fa3(mlir::gpu::GPUModuleOp module, const KernelSpec &spec, const Plan &plan, BuiltKernel *out) {
  if (std::string why = fa3_unsupported_reason(spec); !why.empty())
    return Status::error(FLASHJIT_UNSUPPORTED, "fa3 (MLIR): " + why);
  Config c{};
  if (Status s = read_config(spec, plan, &c); !s)
    return s;

  mlir::OpBuilder b(module.getContext());
  mlir::Location loc = b.getUnknownLoc();
  b.setInsertionPointToEnd(module.getBody());
  HopperEmitter e{{b, loc}};
  mlir::LLVM::LLVMStructType params_type = fa3_params_type(e);

  // extern __shared__ u8 smem_raw[] (16-byte aligned; the kernel rounds its base up to kSmemAlign)
  const char *kSmemSymbol = "fj_fa3_smem";
  extern_shared(e, kSmemSymbol, kChunkBytes);

  auto fn = mlir::gpu::GPUFuncOp::create(b, loc, plan.entry, b.getFunctionType({e.ptr()}, {}));
  fn->setAttr(mlir::gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
  fn.setKnownBlockSizeAttr(b.getDenseI32ArrayAttr({c.threads, 1, 1})); // .maxntid: __launch_bounds__(kThreads, 1)
  b.setInsertionPointToStart(&fn.getBody().front());
  Value pp = fn.getArgument(0);

  Value raw = e.shared_u32(mlir::LLVM::AddressOfOp::create(b, loc, e.ptr(kSharedSpace), kSmemSymbol));
  const Smem smem{e, c, e.and_(e.add(raw, e.c_i32(c.smem_align - 1)), e.c_i32(~int64_t(c.smem_align - 1)))};
  const Params p{e, pp, params_type};

  // Broadcast from lane 0 so the role is visibly warp-uniform (otherwise ptxas treats the wgmma
  // code as divergent and serializes it, warning C7520).
  Value warpgroup = e.shfl_idx_sync(e.div_u(e.tid_x(), e.c_i32(kWarpgroupThreads)), 0);
  Value first_thread = e.cmp(Pred::eq, e.tid_x(), e.c_i32(0));
  when(e, first_thread, [&] {
    e.mbarrier_init(smem.q_full(), e.c_i32(1));
    e.mbarrier_init(smem.q_empty(), e.c_i32(c.consumer_wgs));
    for (int stage = 0; stage < c.stages; ++stage) {
      Value st = e.c_i32(stage);
      e.mbarrier_init(smem.k_full(st), e.c_i32(1));
      e.mbarrier_init(smem.k_empty(st), e.c_i32(c.consumer_wgs));
      e.mbarrier_init(smem.v_full(st), e.c_i32(1));
      e.mbarrier_init(smem.v_empty(st), e.c_i32(c.consumer_wgs));
    }
    e.fence_mbarrier_init();
    for (int which = kTmaQ; which <= kTmaO; ++which)
      e.tma_prefetch_descriptor(p.map(which));
  });
  e.bar_sync();

  auto roles = scf::IfOp::create(b, loc, e.cmp(Pred::eq, warpgroup, e.c_i32(0)), /*withElseRegion=*/true);
  {
    mlir::OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(roles.thenBlock()->getTerminator());
    e.setmaxnreg(c.regs_producer, /*increase=*/false);
    when(e, e.cmp(Pred::eq, e.tid_x(), e.c_i32(0)), [&] {
      Producer producer{e, c, p, smem, e.l2_policy(/*evict_last=*/true), e.l2_policy(/*evict_last=*/false)};
      producer.run();
    });
    b.setInsertionPoint(roles.elseBlock()->getTerminator());
    e.setmaxnreg(c.regs_consumer, /*increase=*/true);
    Value wg = e.sub(warpgroup, e.c_i32(1));
    Value tid = e.rem_u(e.tid_x(), e.c_i32(kWarpgroupThreads));
    Value scale = param_at(e, pp, params_type, {kBase, kScale});
    Value softcap = param_at(e, pp, params_type, {kBase, kSoftcapField});
    Value softcap_inv = param_at(e, pp, params_type, {kBase, kSoftcapInv});
    const Epilogue epilogue{e, c, p, smem, wg, tid};
    Consumer consumer{e,
                      c,
                      p,
                      smem,
                      wg,
                      tid,
                      param_at(e, pp, params_type, {kBase, kScaleLog2}),
                      e.fmul(scale, softcap_inv),
                      c.softcap ? Value(mlir::arith::DivFOp::create(b, loc, softcap, scale)) : e.c_f32(0.0f)};
    consumer.run(epilogue);
  }
  mlir::gpu::ReturnOp::create(b, loc);
  if (Status s = layout_matches("fa3", fn, params_type, int(sizeof(fj_fa3_params))); !s)
    return s;

  *out = BuiltKernel{plan.entry, 0, params_type, int(sizeof(fj_fa3_params)), 1};
  return Status::success();
}

} // namespace flashjit::mlirgen
