// What the mma.sync generators (gen_decode.cpp, gen_fa2.cpp) share beyond emit.hpp's primitives:
// the m16n8k16 / cp.async shapes, fj_attention_params as an LLVM struct with its field paths,
// ld.param of a nested field, `if` without results, the kernel function and plan-constant
// plumbing, and the ldmatrix .x2 forms (head dims of 8 mod 16).
#pragma once

#include "compiler/mlir/emit.hpp"
#include "compiler/plan.hpp"

#include "kernel_params.h"

#include "mlir/Interfaces/DataLayoutInterfaces.h"

#include <flashjit/flashjit.hpp>

#include <cstddef>
#include <initializer_list>
#include <string>

namespace flashjit::mlirgen {

// The m16n8k16 MMA shape and how a 16-bit row splits into 16-byte cp.async chunks.
constexpr int kMmaM = 16;
constexpr int kMmaN = 8;
constexpr int kMmaK = 16;
constexpr int kElemBytes = 2;
constexpr int kChunkBytes = 16;
constexpr int kChunkElems = kChunkBytes / kElemBytes;
constexpr int kHalfTile = 8; // rows g and g + 8 of a C fragment
constexpr int kFragment = 4; // floats of a C fragment per thread

// Field paths into fj_attention_params. Layout checked against the C struct below and against
// MLIR's data layout at generation time (layout_matches).
enum TensorField { kPtr, kBatchStride, kRowStride, kHeadStride };
enum PagedField { kBlockTable, kMaxPagesPerSeq, kPageSizeField, kPageStrideK, kPageStrideV };
enum AttnField {
  kQ,
  kK,
  kV,
  kO,
  kMaybeLse,
  kCuQ,
  kCuK,
  kMaybeSeqlensK,
  kPaged,
  kBatch,
  kSeqlenQ,
  kSeqlenK,
  kTotalQ,
  kHeadsQ,
  kHeadsKv,
  kGroup,
  kWindowLeft,
  kWindowRight,
  kScaleLog2,
  kSoftcapField,
  kSoftcapInv,
  kScale,
  kPartialO,
  kPartialLse,
  kNumSplits,
  kNumMBlocks,
};
static_assert(offsetof(fj_attention_params, maybe_lse) == 128 && offsetof(fj_attention_params, paged) == 160 &&
                  offsetof(fj_attention_params, batch) == 192 && offsetof(fj_attention_params, scale) == 240 &&
                  offsetof(fj_attention_params, maybe_partial_o) == 248 && sizeof(fj_attention_params) == 272,
              "attention_params_type below mirrors templates/kernel_params.h field for field");

inline mlir::LLVM::LLVMStructType attention_params_type(Emitter &e) {
  mlir::MLIRContext *c = e.b.getContext();
  mlir::Type p = e.ptr(), i64 = e.i64(), i32 = e.i32(), f32 = e.f32();
  auto tensor = mlir::LLVM::LLVMStructType::getLiteral(c, {p, i64, i64, i64});
  auto paged = mlir::LLVM::LLVMStructType::getLiteral(c, {p, i32, i32, i64, i64});
  return mlir::LLVM::LLVMStructType::getLiteral(c, {tensor, tensor, tensor, tensor, p,   p,   p,   p,   paged,
                                                    i32,    i32,    i32,    i32,    i32, i32, i32, i32, i32,
                                                    f32,    f32,    f32,    f32,    p,   p,   i32, i32});
}

// ld.param of the field at `path` (indices after the leading 0).
inline mlir::Value param_at(Emitter &e, mlir::Value params, mlir::LLVM::LLVMStructType type,
                            std::initializer_list<int> path) {
  llvm::SmallVector<mlir::LLVM::GEPArg> indices{0};
  mlir::Type field = type;
  for (int i : path) {
    indices.push_back(i);
    field = llvm::cast<mlir::LLVM::LLVMStructType>(field).getBody()[i];
  }
  mlir::Value address = mlir::LLVM::GEPOp::create(e.b, e.loc, e.ptr(), type, params, indices);
  return mlir::LLVM::LoadOp::create(e.b, e.loc, field, address);
}

// Emits `body` under `if (cond)`.
template <typename Body> void when(Emitter &e, mlir::Value cond, Body &&body) {
  auto op = mlir::scf::IfOp::create(e.b, e.loc, cond, /*withElseRegion=*/false);
  mlir::OpBuilder::InsertionGuard guard(e.b);
  e.b.setInsertionPoint(op.thenBlock()->getTerminator());
  body();
}

// `if (cond) then() else otherwise()` yielding values of `types`.
template <typename Then, typename Else>
mlir::ResultRange if_values(Emitter &e, mlir::Value cond, mlir::TypeRange types, Then &&then, Else &&otherwise) {
  auto op = mlir::scf::IfOp::create(e.b, e.loc, types, cond, /*withElseRegion=*/true);
  mlir::OpBuilder::InsertionGuard guard(e.b);
  e.b.setInsertionPointToStart(op.thenBlock());
  mlir::scf::YieldOp::create(e.b, e.loc, mlir::ValueRange(then()));
  e.b.setInsertionPointToStart(op.elseBlock());
  mlir::scf::YieldOp::create(e.b, e.loc, mlir::ValueRange(otherwise()));
  return op.getResults();
}

// extern __shared__ __align__(align) u8 name[] — the dynamic shared memory of a kernel.
inline void extern_shared(Emitter &e, const char *name, int align) {
  mlir::LLVM::GlobalOp::create(e.b, e.loc, mlir::LLVM::LLVMArrayType::get(e.b.getI8Type(), 0), /*isConstant=*/false,
                               mlir::LLVM::Linkage::External, name, mlir::Attribute{}, align, kSharedSpace);
}

// A gpu.func kernel taking the parameter block as !llvm.ptr; `threads` becomes .maxntid, as
// __launch_bounds__ does.
inline mlir::gpu::GPUFuncOp kernel_func(Emitter &e, const std::string &name, int threads) {
  auto fn = mlir::gpu::GPUFuncOp::create(e.b, e.loc, name, e.b.getFunctionType({e.ptr()}, {}));
  fn->setAttr(mlir::gpu::GPUDialect::getKernelFuncAttrName(), e.b.getUnitAttr());
  fn.setKnownBlockSizeAttr(e.b.getDenseI32ArrayAttr({threads, 1, 1}));
  return fn;
}

// The by-value block must have the C struct's size under MLIR's data layout too.
inline Status layout_matches(const char *what, mlir::gpu::GPUFuncOp fn, mlir::LLVM::LLVMStructType type, int bytes) {
  const auto layout_bytes = mlir::DataLayout::closest(fn).getTypeSize(type);
  if (layout_bytes != uint64_t(bytes))
    return Status::error(FLASHJIT_INTERNAL, std::string(what) + ": MLIR lays the parameter block out in " +
                                                std::to_string(layout_bytes) + " bytes, C in " + std::to_string(bytes));
  return Status::success();
}

inline Status plan_int(const char *what, const Plan &plan, const char *name, int *out) {
  const long long missing = -1;
  const long long v = plan.constant(name, missing);
  if (v == missing)
    return Status::error(FLASHJIT_INTERNAL, std::string(what) + ": the plan has no " + name);
  *out = int(v);
  return Status::success();
}

// A plan constant and where a generator keeps it.
template <typename T> struct PlanField {
  const char *name;
  T *field;
};

// Reads every named constant of the plan (ints, or flags as nonzero); the first absent one is an
// internal error naming it: a generator never falls back to a default of its own.
template <typename T> Status read_plan(const char *what, const Plan &plan, std::initializer_list<PlanField<T>> fields) {
  for (const PlanField<T> &f : fields) {
    int value = 0;
    if (Status s = plan_int(what, plan, f.name, &value); !s)
      return s;
    *f.field = static_cast<T>(value);
  }
  return Status::success();
}

// ldmatrix.sync.aligned.m8n8.x2{.trans}.shared.b16 {d0, d1}, [a] — lanes 0..15 supply addresses
inline std::array<mlir::Value, 2> ldmatrix_x2(Emitter &e, mlir::Value address_shared, bool trans) {
  constexpr int kMatrices = 2, kRows = 8;
  mlir::MLIRContext *c = e.b.getContext();
  mlir::Type result = mlir::LLVM::LLVMStructType::getLiteral(c, {e.i32(), e.i32()});
  mlir::Value v = mlir::NVVM::LdMatrixOp::create(
      e.b, e.loc, result, address_shared, e.b.getI32IntegerAttr(kMatrices),
      mlir::NVVM::MMALayoutAttr::get(c, trans ? mlir::NVVM::MMALayout::col : mlir::NVVM::MMALayout::row),
      mlir::NVVM::LdStMatrixShapeAttr::get(c, kRows, kRows),
      mlir::NVVM::LdStMatrixEltTypeAttr::get(c, mlir::NVVM::LdStMatrixEltType::B16));
  return {mlir::LLVM::ExtractValueOp::create(e.b, e.loc, v, 0), mlir::LLVM::ExtractValueOp::create(e.b, e.loc, v, 1)};
}

} // namespace flashjit::mlirgen
