// The combine kernel (templates/kernels/combine.cuh) built with MLIR: merge `num_states` partial
// attention states (O_i normalized over its own keys, fp32, and LSE_i in natural log) per row,
//   LSE = log(sum_i exp(LSE_i)),   O = sum_i exp(LSE_i - LSE) * O_i,
// one warp per row, grid-stride over the rows. A state with LSE_i = -inf weighs 0 whatever its O;
// a row whose states are all -inf gets O = 0, LSE = -inf. Entry and parameters are those of the
// NVRTC kernel: fj_combine(const __grid_constant__ fj_combine_params p).
#include "compiler/mlir/emit.hpp"
#include "compiler/mlir/generators.hpp"
#include "compiler/mlir/merge_states.hpp"

#include "kernel_params.h"

#include "mlir/Interfaces/DataLayoutInterfaces.h"

#include <cstddef>
#include <string>
#include <vector>

namespace flashjit::mlirgen {
namespace {

using mlir::Value;
using mlir::ValueRange;
namespace arith = mlir::arith;
namespace scf = mlir::scf;

// The merge shape of combine.cuh (its kF32PerVec, kMergeLoadsInFlight): every lane owns groups of
// four consecutive fp32 columns (one v4 load per state) and keeps eight v4 loads in flight, so
// states go kBatch at a time and a merge of n states costs about n / kBatch memory latencies.
constexpr int kF32PerVec = kVec4;
constexpr int kMergeLoadsInFlight = 8;
constexpr int kMergeChunk = 8; // head_dim_v granularity of the planner

struct MergeShape {
  int vecs = 0;          // v4 groups per row
  int vecs_per_lane = 0; // v4 groups per lane
  int batch = 0;         // states per batch
  explicit MergeShape(int head_dim_v)
      : vecs(head_dim_v / kF32PerVec), vecs_per_lane((vecs + kWarpSize - 1) / kWarpSize),
        batch(kMergeLoadsInFlight / vecs_per_lane) {}
};

// fj_combine_params, field by field; the layout must equal the C struct's (checked below and
// against MLIR's data layout at generation time).
enum CombineField {
  kPartialO,
  kPartialLse,
  kStateStrideO,
  kStateStrideLse,
  kOut,
  kORowStride,
  kMaybeLse,
  kNumStates,
  kRows,
  kHeadDimVField,
  kPadField,
};
static_assert(offsetof(fj_combine_params, partial_lse) == 8 && offsetof(fj_combine_params, o) == 32 &&
                  offsetof(fj_combine_params, maybe_lse) == 48 && offsetof(fj_combine_params, num_states) == 56 &&
                  sizeof(fj_combine_params) == 72,
              "combine_params_type below mirrors templates/kernel_params.h field for field");

mlir::LLVM::LLVMStructType combine_params_type(Emitter &e) {
  mlir::Type p = e.ptr(), i64 = e.i64(), i32 = e.i32();
  return mlir::LLVM::LLVMStructType::getLiteral(e.b.getContext(), {p, p, i64, i64, p, i64, p, i32, i32, i32, i32});
}

// sum over lanes of f(state) for states lane, lane + 32, ... < count, then a warp reduction.
template <typename Combine>
Value strided_states_reduce(Emitter &e, Value lane, Value count, Value init, Combine &&combine) {
  auto loop = scf::ForOp::create(e.b, e.loc, lane, count, e.c_i32(kWarpSize), ValueRange{init},
                                 [&](mlir::OpBuilder &, mlir::Location, Value s, ValueRange carried) {
                                   scf::YieldOp::create(e.b, e.loc, combine(s, carried[0]));
                                 });
  return loop.getResult(0);
}

// ld.global.cg.f32 d, [a] (prim/ld_global.cuh): a state other CTAs of this grid wrote.
Value ld_global_cg_f32(Emitter &e, Value address) {
  return e.asm_value(e.f32(), {e.to_global(address)}, "ld.global.cg.f32 $0, [$1];", "=f,l");
}

// ld.global.cg.v4.f32 {d0..d3}, [a] — a 16-byte aligned
Value ld_global_cg_v4_f32(Emitter &e, Value address) {
  mlir::Type f32 = e.f32();
  auto four = mlir::LLVM::LLVMStructType::getLiteral(e.b.getContext(), {f32, f32, f32, f32});
  Value out = e.asm_value(four, {e.to_global(address)}, "ld.global.cg.v4.f32 {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,l");
  llvm::SmallVector<Value, kVec4> elems;
  for (int i = 0; i < kVec4; ++i)
    elems.push_back(mlir::LLVM::ExtractValueOp::create(e.b, e.loc, out, i));
  return mlir::vector::FromElementsOp::create(e.b, e.loc, e.v4f32(), elems);
}

} // namespace

// merge_states_row of combine.cuh: warp-wide merge of `count` states of one row.
void merge_states_row(Emitter &e, const RowMerge &m, Value o_states, Value o_stride, Value lse_states, Value lse_stride,
                      Value count, Value out_row, Value maybe_lse, Value row64) {
  const MergeShape shape(m.head_dim_v);
  mlir::Type f32 = e.f32();
  Value lane = e.lane_id();
  Value zero_f = e.c_f32(0.f), zero_i = e.c_i32(0), neg_inf = e.neg_inf();
  auto lse_at = [&](Value state) { return e.gep(lse_states, f32, e.mul(e.sext64(state), lse_stride)); };
  // ld_state_f32 / ld_state_v4_f32 of combine.cuh: only the load instruction depends on `coherent`.
  auto ld_state_f32 = [&](Value address) {
    return m.coherent ? ld_global_cg_f32(e, address) : e.ld_global_nc_f32(address);
  };
  auto ld_state_v4_f32 = [&](Value address) {
    return m.coherent ? ld_global_cg_v4_f32(e, address) : e.ld_global_nc_v4_f32(address);
  };

  // states_max_lse
  Value max_lse = e.warp_reduce_max(strided_states_reduce(
      e, lane, count, neg_inf, [&](Value s, Value best) { return e.max_f32(best, ld_state_f32(lse_at(s))); }));
  Value empty = e.cmpf(arith::CmpFPredicate::OEQ, max_lse, neg_inf);

  // states_sum_exp and its reciprocal, skipped when every state is empty
  auto sums = scf::IfOp::create(e.b, e.loc, mlir::TypeRange{f32, f32}, empty, /*withElseRegion=*/true);
  {
    mlir::OpBuilder::InsertionGuard guard(e.b);
    e.b.setInsertionPointToStart(sums.thenBlock());
    scf::YieldOp::create(e.b, e.loc, ValueRange{zero_f, zero_f});
    e.b.setInsertionPointToStart(sums.elseBlock());
    Value partial = strided_states_reduce(e, lane, count, zero_f, [&](Value s, Value sum) {
      Value shifted = e.fmul(e.fsub(ld_state_f32(lse_at(s)), max_lse), e.c_f32(kLog2e));
      return e.fadd(sum, e.ex2_approx(shifted));
    });
    Value sum = e.warp_reduce_sum(partial);
    scf::YieldOp::create(e.b, e.loc, ValueRange{sum, e.rcp_approx(sum)});
  }
  Value sum = sums.getResult(0), inv_sum = sums.getResult(1);

  // Batches of states: loads are unconditional (indices clamped to the last state / v4 group, the
  // weight or the store dropped) so a batch issues as one burst without branches.
  std::vector<Value> init(shape.vecs_per_lane, e.c_v4f32(0.f));
  Value last_state = e.add(count, e.c_i32(-1));
  Value upper = e.select(empty, zero_i, count);
  auto batches =
      scf::ForOp::create(e.b, e.loc, zero_i, upper, e.c_i32(shape.batch), init,
                         [&](mlir::OpBuilder &, mlir::Location, Value first, ValueRange carried) {
                           std::vector<Value> state(shape.batch), lse(shape.batch);
                           for (int s = 0; s < shape.batch; ++s) {
                             state[s] = e.min_s(e.add(first, e.c_i32(s)), last_state);
                             lse[s] = ld_state_f32(lse_at(state[s]));
                           }
                           std::vector<std::vector<Value>> v(shape.batch, std::vector<Value>(shape.vecs_per_lane));
                           for (int s = 0; s < shape.batch; ++s)
                             for (int c = 0; c < shape.vecs_per_lane; ++c) {
                               Value vec = e.min_s(e.add(lane, e.c_i32(c * kWarpSize)), e.c_i32(shape.vecs - 1));
                               Value column = e.sext64(e.mul(vec, e.c_i32(kF32PerVec)));
                               Value offset = e.add(e.mul(e.sext64(state[s]), o_stride), column);
                               v[s][c] = ld_state_v4_f32(e.gep(o_states, f32, offset));
                             }
                           std::vector<Value> acc(carried.begin(), carried.end());
                           Value zero4 = e.c_v4f32(0.f);
                           for (int s = 0; s < shape.batch; ++s) {
                             Value in_range = e.cmp(arith::CmpIPredicate::slt, e.add(first, e.c_i32(s)), count);
                             Value exp = e.ex2_approx(e.fmul(e.fsub(lse[s], max_lse), e.c_f32(kLog2e)));
                             Value weight = e.select(in_range, e.fmul(exp, inv_sum), zero_f);
                             // an empty state weighs 0 and its O may be anything (even NaN): select, don't multiply
                             Value counts = e.cmpf(arith::CmpFPredicate::OGT, weight, zero_f);
                             Value w4 = e.splat4(weight);
                             for (int c = 0; c < shape.vecs_per_lane; ++c)
                               acc[c] = e.fadd(acc[c], e.select(counts, e.fmul(w4, v[s][c]), zero4));
                           }
                           scf::YieldOp::create(e.b, e.loc, acc);
                         });

  // Stores: four 16-bit values per v4 group, 8 bytes at once when rows are 16-byte aligned.
  for (int c = 0; c < shape.vecs_per_lane; ++c) {
    Value vec = e.add(lane, e.c_i32(c * kWarpSize));
    const bool may_overrun = (c + 1) * kWarpSize > shape.vecs;
    mlir::OpBuilder::InsertionGuard guard(e.b);
    if (may_overrun) {
      auto inside = scf::IfOp::create(e.b, e.loc, e.cmp(arith::CmpIPredicate::slt, vec, e.c_i32(shape.vecs)),
                                      /*withElseRegion=*/false);
      e.b.setInsertionPoint(inside.thenBlock()->getTerminator());
    }
    Value acc = batches.getResult(c);
    Value out = e.gep(out_row, e.b.getI16Type(), e.sext64(e.mul(vec, e.c_i32(kF32PerVec))));
    Value a[kF32PerVec];
    for (int i = 0; i < kF32PerVec; ++i)
      a[i] = e.extract(acc, i);
    if (m.aligned16) {
      Value packed = mlir::vector::FromElementsOp::create(
          e.b, e.loc, mlir::VectorType::get({2}, e.i32()),
          ValueRange{e.pack2_from_f32(m.dtype, a[0], a[1]), e.pack2_from_f32(m.dtype, a[2], a[3])});
      e.st_global_v2_b32(out, packed);
    } else {
      for (int i = 0; i < kF32PerVec; ++i)
        e.st_global_b16(e.gep(out, e.b.getI16Type(), e.c_i64(i)), e.cvt_rn_16_f32(m.dtype, a[i]));
    }
  }

  // LSE of the merged row, by lane 0, when asked for.
  Value wants_lse = e.and_(e.cmp(arith::CmpIPredicate::eq, lane, zero_i),
                           mlir::arith::XOrIOp::create(e.b, e.loc, e.is_null(maybe_lse),
                                                       arith::ConstantIntOp::create(e.b, e.loc, e.i1(), 1)));
  auto write_lse = scf::IfOp::create(e.b, e.loc, wants_lse, /*withElseRegion=*/false);
  mlir::OpBuilder::InsertionGuard guard(e.b);
  e.b.setInsertionPoint(write_lse.thenBlock()->getTerminator());
  Value merged = e.fadd(max_lse, e.fmul(e.lg2_approx(sum), e.c_f32(kLn2)));
  e.st_global_f32(e.gep(maybe_lse, f32, row64), e.select(empty, neg_inf, merged));
}

Status build_combine(mlir::gpu::GPUModuleOp module, const KernelSpec &spec, const Plan &plan, BuiltKernel *out) {
  if (spec.head_dim_v <= 0 || spec.head_dim_v % kMergeChunk != 0)
    return Status::error(FLASHJIT_INVALID_ARGUMENT, "combine: head_dim_v must be a positive multiple of 8");
  const int threads = int(plan.constant("kCombineThreads", plan.threads));
  if (threads <= 0 || threads % kWarpSize != 0)
    return Status::error(FLASHJIT_INVALID_ARGUMENT,
                         "combine: the plan's kCombineThreads is not a whole number of warps");
  const int warps = threads / kWarpSize;
  const RowMerge merge{spec.dtype == FLASHJIT_FP16 ? DType::fp16 : DType::bf16, spec.head_dim_v,
                       spec.align_bytes >= 16};

  mlir::OpBuilder b(module.getContext());
  mlir::Location loc = b.getUnknownLoc();
  b.setInsertionPointToEnd(module.getBody());
  Emitter e{b, loc};
  mlir::LLVM::LLVMStructType params_type = combine_params_type(e);

  auto fn = mlir::gpu::GPUFuncOp::create(b, loc, plan.entry, b.getFunctionType({e.ptr()}, {}));
  fn->setAttr(mlir::gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
  fn.setKnownBlockSizeAttr(b.getDenseI32ArrayAttr({threads, 1, 1})); // .maxntid, as __launch_bounds__
  b.setInsertionPointToStart(&fn.getBody().front());
  Value p = fn.getArgument(0);

  Value partial_o = e.param(p, params_type, kPartialO);
  Value partial_lse = e.param(p, params_type, kPartialLse);
  Value stride_o = e.param(p, params_type, kStateStrideO);
  Value stride_lse = e.param(p, params_type, kStateStrideLse);
  Value o = e.param(p, params_type, kOut);
  Value o_row_stride = e.param(p, params_type, kORowStride);
  Value maybe_lse = e.param(p, params_type, kMaybeLse);
  Value num_states = e.param(p, params_type, kNumStates);
  Value rows = e.param(p, params_type, kRows);

  Value first_row = e.add(e.mul(e.ctaid_x(), e.c_i32(warps)), e.warp_id());
  Value row_step = e.mul(e.nctaid_x(), e.c_i32(warps));
  scf::ForOp::create(
      b, loc, first_row, rows, row_step, ValueRange{}, [&](mlir::OpBuilder &, mlir::Location, Value row, ValueRange) {
        Value row64 = e.sext64(row);
        Value o_states = e.gep(partial_o, e.f32(), e.mul(row64, e.c_i64(spec.head_dim_v)));
        Value lse_states = e.gep(partial_lse, e.f32(), row64);
        Value out_row = e.gep(o, b.getI16Type(), e.mul(row64, o_row_stride));
        merge_states_row(e, merge, o_states, stride_o, lse_states, stride_lse, num_states, out_row, maybe_lse, row64);
        scf::YieldOp::create(b, loc);
      });
  mlir::gpu::ReturnOp::create(b, loc);

  out->entry = plan.entry;
  out->params_argument = 0;
  out->params_type = params_type;
  out->params_bytes = int(sizeof(fj_combine_params));
  const auto layout_bytes = mlir::DataLayout::closest(fn).getTypeSize(params_type);
  if (layout_bytes != uint64_t(out->params_bytes))
    return Status::error(FLASHJIT_INTERNAL, "combine: MLIR lays fj_combine_params out in " +
                                                std::to_string(layout_bytes) + " bytes, C in " +
                                                std::to_string(out->params_bytes));
  return Status::success();
}

} // namespace flashjit::mlirgen
