// The MLIR backend's device primitives: one small function per PTX instruction family, named
// after it, with the PTX it becomes in a one-line comment; the same vocabulary as templates/prim/,
// so a generator reads like its .cuh counterpart. Values are i32 / i64 / f32 / vector<4xf32> and
// !llvm.ptr; no `index` type, so nothing needs an index-width conversion.
#pragma once

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Builders.h"

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace flashjit::mlirgen {

// Address spaces of NVPTX.
constexpr unsigned kGenericSpace = 0;
constexpr unsigned kGlobalSpace = 1;
constexpr unsigned kSharedSpace = 3;
constexpr int kWarpSize = 32;
constexpr int kQuadSize = 4; // lanes sharing the rows of an mma C fragment
constexpr uint32_t kFullMask = 0xffffffffu;
constexpr int kShflClamp = 0x1f; // shfl.sync c operand: clamp at lane 31, whole-warp segment
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kF32Bytes = 4;
constexpr int kB16Bytes = 2;
constexpr int kVec4 = 4;

enum class DType { fp16, bf16 };

struct Emitter {
  mlir::OpBuilder &b;
  mlir::Location loc;

  // --- inline PTX (templates' asm volatile): `constraints` in LLVM syntax ("=r,r,~{memory}")
  mlir::Value asm_value(mlir::Type result, mlir::ValueRange operands, const std::string &ptx,
                        const std::string &constraints) {
    auto op = mlir::LLVM::InlineAsmOp::create(
        b, loc, result, operands, b.getStringAttr(ptx), b.getStringAttr(constraints), b.getUnitAttr(), mlir::UnitAttr{},
        mlir::LLVM::TailCallKindAttr::get(b.getContext(), mlir::LLVM::tailcallkind::TailCallKind::None),
        mlir::LLVM::AsmDialectAttr::get(b.getContext(), mlir::LLVM::AsmDialect::AD_ATT), mlir::ArrayAttr{});
    return result ? op.getResult(0) : mlir::Value{};
  }
  void asm_void(mlir::ValueRange operands, const std::string &ptx, const std::string &constraints) {
    asm_value(mlir::Type{}, operands, ptx, constraints);
  }
  // createpolicy.fractional.L2::evict_last.b64 d, 1.0 / evict_first
  mlir::Value l2_policy(bool evict_last) {
    return asm_value(i64(), {},
                     std::string("createpolicy.fractional.L2::") + (evict_last ? "evict_last" : "evict_first") +
                         ".b64 $0, 1.0;",
                     "=l");
  }

  // --- types and constants
  mlir::Type i1() const { return b.getI1Type(); }
  mlir::Type i32() const { return b.getI32Type(); }
  mlir::Type i64() const { return b.getI64Type(); }
  mlir::Type f32() const { return b.getF32Type(); }
  mlir::VectorType v4f32() const { return mlir::VectorType::get({kVec4}, f32()); }
  mlir::Type ptr(unsigned space = kGenericSpace) const {
    return mlir::LLVM::LLVMPointerType::get(b.getContext(), space);
  }
  mlir::Value c_i32(int64_t v) { return mlir::arith::ConstantIntOp::create(b, loc, i32(), v); }
  mlir::Value c_i64(int64_t v) { return mlir::arith::ConstantIntOp::create(b, loc, i64(), v); }
  mlir::Value c_f32(float v) { return mlir::arith::ConstantFloatOp::create(b, loc, b.getF32Type(), llvm::APFloat(v)); }
  mlir::Value c_v4f32(float v) {
    return mlir::arith::ConstantOp::create(b, loc, mlir::DenseElementsAttr::get(v4f32(), b.getF32FloatAttr(v)));
  }
  // mov.b32 d, 0fFF800000 — -inf
  mlir::Value neg_inf() { return c_f32(-std::numeric_limits<float>::infinity()); }

  // --- special registers
  // mov.u32 d, %tid.x
  mlir::Value tid_x() { return mlir::NVVM::ThreadIdXOp::create(b, loc, i32()); }
  // mov.u32 d, %ctaid.x
  mlir::Value ctaid_x() { return mlir::NVVM::BlockIdXOp::create(b, loc, i32()); }
  // mov.u32 d, %nctaid.x
  mlir::Value nctaid_x() { return mlir::NVVM::GridDimXOp::create(b, loc, i32()); }
  mlir::Value lane_id() { return mlir::arith::RemUIOp::create(b, loc, tid_x(), c_i32(kWarpSize)); }
  mlir::Value warp_id() { return mlir::arith::DivUIOp::create(b, loc, tid_x(), c_i32(kWarpSize)); }

  // --- integer / float arithmetic (arith dialect; NVPTX picks the instructions)
  mlir::Value add(mlir::Value x, mlir::Value y) { return mlir::arith::AddIOp::create(b, loc, x, y); }
  mlir::Value mul(mlir::Value x, mlir::Value y) { return mlir::arith::MulIOp::create(b, loc, x, y); }
  mlir::Value min_s(mlir::Value x, mlir::Value y) { return mlir::arith::MinSIOp::create(b, loc, x, y); }
  mlir::Value sext64(mlir::Value x) { return mlir::arith::ExtSIOp::create(b, loc, i64(), x); }
  mlir::Value cmp(mlir::arith::CmpIPredicate p, mlir::Value x, mlir::Value y) {
    return mlir::arith::CmpIOp::create(b, loc, p, x, y);
  }
  mlir::Value cmpf(mlir::arith::CmpFPredicate p, mlir::Value x, mlir::Value y) {
    return mlir::arith::CmpFOp::create(b, loc, p, x, y);
  }
  mlir::Value select(mlir::Value c, mlir::Value x, mlir::Value y) {
    return mlir::arith::SelectOp::create(b, loc, c, x, y);
  }
  mlir::Value and_(mlir::Value x, mlir::Value y) { return mlir::arith::AndIOp::create(b, loc, x, y); }
  // Float ops carry `contract`, so a multiply feeding an add may fuse into fma.rn.f32, as NVRTC's
  // default --fmad=true allows for the template kernels.
  template <typename Op> mlir::Value contracted(mlir::Value x, mlir::Value y) {
    auto op = Op::create(b, loc, x, y);
    op.setFastmath(mlir::arith::FastMathFlags::contract);
    return op;
  }
  mlir::Value fadd(mlir::Value x, mlir::Value y) { return contracted<mlir::arith::AddFOp>(x, y); }
  mlir::Value fsub(mlir::Value x, mlir::Value y) { return contracted<mlir::arith::SubFOp>(x, y); }
  mlir::Value fmul(mlir::Value x, mlir::Value y) { return contracted<mlir::arith::MulFOp>(x, y); }
  mlir::Value splat4(mlir::Value x) { return mlir::vector::BroadcastOp::create(b, loc, v4f32(), x); }

  // --- math (templates/prim/math.cuh)
  // ex2.approx.ftz.f32 d, a
  mlir::Value ex2_approx(mlir::Value x) {
    return mlir::LLVM::CallIntrinsicOp::create(b, loc, f32(), b.getStringAttr("llvm.nvvm.ex2.approx.ftz.f32"),
                                               mlir::ValueRange{x})
        .getResult(0);
  }
  // lg2.approx.ftz.f32 d, a
  mlir::Value lg2_approx(mlir::Value x) {
    return mlir::LLVM::CallIntrinsicOp::create(b, loc, f32(), b.getStringAttr("llvm.nvvm.lg2.approx.ftz.f"),
                                               mlir::ValueRange{x})
        .getResult(0);
  }
  // rcp.approx.ftz.f32 d, a
  mlir::Value rcp_approx(mlir::Value x) { return mlir::NVVM::RcpApproxFtzF32Op::create(b, loc, f32(), x); }
  // max.f32 d, a, b — the non-NaN operand when one is NaN (llvm.maxnum)
  mlir::Value max_f32(mlir::Value x, mlir::Value y) { return mlir::LLVM::MaxNumOp::create(b, loc, x, y); }

  // --- warp (templates/prim/warp.cuh)
  // shfl.sync.bfly.b32 d, a, lane_mask, 0x1f, 0xffffffff
  mlir::Value shfl_xor_sync(mlir::Value v, int lane_mask) {
    return mlir::NVVM::ShflOp::create(
        b, loc, v.getType(), c_i32(int32_t(kFullMask)), v, c_i32(lane_mask), c_i32(kShflClamp),
        mlir::NVVM::ShflKindAttr::get(b.getContext(), mlir::NVVM::ShflKind::bfly), mlir::UnitAttr{});
  }
  mlir::Value warp_reduce_max(mlir::Value v) {
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
      v = max_f32(v, shfl_xor_sync(v, offset));
    return v;
  }
  mlir::Value warp_reduce_sum(mlir::Value v) {
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
      v = fadd(v, shfl_xor_sync(v, offset));
    return v;
  }

  // --- addresses
  // `base` + `index` elements of `element` (i64 index): add.s64 / mad.wide
  mlir::Value gep(mlir::Value base, mlir::Type element, mlir::Value index) {
    return mlir::LLVM::GEPOp::create(b, loc, base.getType(), element, base, mlir::ValueRange{index});
  }
  mlir::Value to_global(mlir::Value generic) {
    return mlir::LLVM::AddrSpaceCastOp::create(b, loc, ptr(kGlobalSpace), generic);
  }
  // Field `field` of the by-value parameter struct `type` behind `params` (ld.param).
  mlir::Value param(mlir::Value params, mlir::LLVM::LLVMStructType type, int field) {
    mlir::Value address =
        mlir::LLVM::GEPOp::create(b, loc, ptr(), type, params, llvm::ArrayRef<mlir::LLVM::GEPArg>{0, field});
    return mlir::LLVM::LoadOp::create(b, loc, type.getBody()[field], address);
  }
  mlir::Value is_null(mlir::Value p) {
    mlir::Value null = mlir::LLVM::ZeroOp::create(b, loc, p.getType());
    return mlir::LLVM::ICmpOp::create(b, loc, mlir::LLVM::ICmpPredicate::eq, p, null);
  }

  // --- global loads (templates/prim/ld_global.cuh); invariant loads of global memory become .nc
  // ld.global.nc.f32 d, [a]
  mlir::Value ld_global_nc_f32(mlir::Value address) {
    return mlir::LLVM::LoadOp::create(b, loc, f32(), to_global(address), kF32Bytes, false, false,
                                      /*isInvariant=*/true);
  }
  // ld.global.nc.v4.f32 {d0..d3}, [a] — a 16-byte aligned
  mlir::Value ld_global_nc_v4_f32(mlir::Value address) {
    return mlir::LLVM::LoadOp::create(b, loc, v4f32(), to_global(address), kVec4 * kF32Bytes, false, false,
                                      /*isInvariant=*/true);
  }

  // --- global stores (templates/prim/st_global.cuh)
  void store(mlir::Value value, mlir::Value address, unsigned alignment) {
    mlir::LLVM::StoreOp::create(b, loc, value, to_global(address), alignment);
  }
  // st.global.f32 [a], b
  void st_global_f32(mlir::Value address, mlir::Value v) { store(v, address, kF32Bytes); }
  // st.global.b16 [a], b
  void st_global_b16(mlir::Value address, mlir::Value v) { store(v, address, kB16Bytes); }
  // st.global.v2.b32 [a], {b0, b1} — a 8-byte aligned
  void st_global_v2_b32(mlir::Value address, mlir::Value v) { store(v, address, 2 * kF32Bytes); }

  // --- conversions (templates/prim/types.cuh)
  mlir::Type type16(DType dtype) const { return dtype == DType::bf16 ? b.getBF16Type() : b.getF16Type(); }
  // cvt.rn.{bf16,f16}.f32 d, a — the raw 16 bits as i16
  mlir::Value cvt_rn_16_f32(DType dtype, mlir::Value x) {
    mlir::Value h = mlir::arith::TruncFOp::create(b, loc, type16(dtype), x);
    return mlir::arith::BitcastOp::create(b, loc, b.getI16Type(), h);
  }
  // cvt.rn.{bf16x2,f16x2}.f32 d, hi, lo — `lo` in the low half (first in memory), as i32
  mlir::Value pack2_from_f32(DType dtype, mlir::Value lo, mlir::Value hi) {
    auto v2 = mlir::VectorType::get({2}, f32());
    mlir::Value pair = mlir::vector::FromElementsOp::create(b, loc, v2, mlir::ValueRange{lo, hi});
    mlir::Value h = mlir::arith::TruncFOp::create(b, loc, mlir::VectorType::get({2}, type16(dtype)), pair);
    return mlir::LLVM::BitcastOp::create(b, loc, i32(), h);
  }
  mlir::Value extract(mlir::Value vec, int64_t i) { return mlir::vector::ExtractOp::create(b, loc, vec, i); }

  // --- more integer arithmetic (signed, as the int math of the templates)
  mlir::Value sub(mlir::Value x, mlir::Value y) { return mlir::arith::SubIOp::create(b, loc, x, y); }
  mlir::Value div_s(mlir::Value x, mlir::Value y) { return mlir::arith::DivSIOp::create(b, loc, x, y); }
  mlir::Value rem_s(mlir::Value x, mlir::Value y) { return mlir::arith::RemSIOp::create(b, loc, x, y); }
  mlir::Value max_s(mlir::Value x, mlir::Value y) { return mlir::arith::MaxSIOp::create(b, loc, x, y); }
  mlir::Value not_(mlir::Value x) {
    return mlir::arith::XOrIOp::create(b, loc, x, mlir::arith::ConstantIntOp::create(b, loc, i1(), 1));
  }
  mlir::Value fneg(mlir::Value x) { return mlir::arith::NegFOp::create(b, loc, x); }

  // --- shared memory (templates/prim/ld_shared.cuh, st_shared.cuh)
  mlir::Value load(mlir::Type type, mlir::Value address, unsigned alignment) {
    return mlir::LLVM::LoadOp::create(b, loc, type, address, alignment);
  }
  // ld.shared / st.shared through a ptr<3>; vector types give .v2 / .v4
  mlir::Value ld_shared(mlir::Type type, mlir::Value address, unsigned alignment) {
    return load(type, address, alignment);
  }
  void st_shared(mlir::Value address, mlir::Value v, unsigned alignment) {
    mlir::LLVM::StoreOp::create(b, loc, v, address, alignment);
  }
  // ld.global.nc.b32 d, [a]
  mlir::Value ld_global_nc_s32(mlir::Value address) {
    return mlir::LLVM::LoadOp::create(b, loc, i32(), to_global(address), kF32Bytes, false, false,
                                      /*isInvariant=*/true);
  }
  // ld.global.nc.v4.b32 {d0..d3}, [a] — a 16-byte aligned
  mlir::Value ld_global_nc_v4_s32(mlir::Value address) {
    return mlir::LLVM::LoadOp::create(b, loc, mlir::VectorType::get({kVec4}, i32()), to_global(address),
                                      kVec4 * kF32Bytes, false, false, /*isInvariant=*/true);
  }
  // st.global.v4.b32 [a], {b0..b3} — a 16-byte aligned
  void st_global_v4(mlir::Value address, mlir::Value v) { store(v, address, kVec4 * kF32Bytes); }

  // --- async copies (templates/prim/cp_async.cuh)
  // cp.async.cg.shared.global [dst], [src], 16, src_bytes — zero-fills past src_bytes
  void cp_async_cg_16(mlir::Value dst_shared, mlir::Value src, mlir::Value src_bytes) {
    constexpr int kCpAsyncBytes = 16;
    mlir::NVVM::CpAsyncOp::create(
        b, loc, dst_shared, to_global(src), b.getI32IntegerAttr(kCpAsyncBytes),
        mlir::NVVM::LoadCacheModifierKindAttr::get(b.getContext(), mlir::NVVM::LoadCacheModifierKind::CG), src_bytes);
  }
  // cp.async.commit_group
  void cp_async_commit_group() { mlir::NVVM::CpAsyncCommitGroupOp::create(b, loc); }
  // cp.async.wait_group n
  void cp_async_wait_group(int n) { mlir::NVVM::CpAsyncWaitGroupOp::create(b, loc, b.getI32IntegerAttr(n)); }

  // --- barriers, grid dependencies (templates/prim/griddep.cuh)
  // bar.sync 0
  void bar_sync() { mlir::NVVM::Barrier0Op::create(b, loc); }
  // griddepcontrol.launch_dependents / griddepcontrol.wait
  void griddepcontrol(mlir::NVVM::GridDepActionKind kind) {
    mlir::NVVM::GriddepcontrolOp::create(b, loc, mlir::NVVM::GridDepActionKindAttr::get(b.getContext(), kind));
  }

  // --- tensor cores (templates/prim/ldmatrix.cuh, mma.cuh)
  // ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 {d0..d3}, [a]
  std::array<mlir::Value, 4> ldmatrix_x4(mlir::Value address_shared, bool trans) {
    constexpr int kMatrices = 4, kRows = 8;
    mlir::Type result = mlir::LLVM::LLVMStructType::getLiteral(b.getContext(), {i32(), i32(), i32(), i32()});
    mlir::Value v = mlir::NVVM::LdMatrixOp::create(
        b, loc, result, address_shared, b.getI32IntegerAttr(kMatrices),
        mlir::NVVM::MMALayoutAttr::get(b.getContext(), trans ? mlir::NVVM::MMALayout::col : mlir::NVVM::MMALayout::row),
        mlir::NVVM::LdStMatrixShapeAttr::get(b.getContext(), kRows, kRows),
        mlir::NVVM::LdStMatrixEltTypeAttr::get(b.getContext(), mlir::NVVM::LdStMatrixEltType::B16));
    std::array<mlir::Value, 4> out;
    for (int i = 0; i < kMatrices; ++i)
      out[i] = mlir::LLVM::ExtractValueOp::create(b, loc, v, i);
    return out;
  }
  // mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 {d}, {a0..a3}, {b0,b1}, {c0..c3}
  // a/b are packed pairs as i32; f16 operands travel as vector<2xf16>.
  std::array<mlir::Value, 4> mma_m16n8k16(DType dtype, const std::array<mlir::Value, 4> &a,
                                          const std::array<mlir::Value, 2> &bm, const std::array<mlir::Value, 4> &c) {
    constexpr int64_t kM = 16, kN = 8, kK = 16;
    auto operand = [&](mlir::Value x) -> mlir::Value {
      if (dtype == DType::bf16)
        return x;
      return mlir::LLVM::BitcastOp::create(b, loc, mlir::VectorType::get({2}, b.getF16Type()), x);
    };
    llvm::SmallVector<mlir::Value, 4> va, vb;
    for (mlir::Value x : a)
      va.push_back(operand(x));
    for (mlir::Value x : bm)
      vb.push_back(operand(x));
    mlir::Type result = mlir::LLVM::LLVMStructType::getLiteral(b.getContext(), {f32(), f32(), f32(), f32()});
    const mlir::NVVM::MMATypes type = dtype == DType::bf16 ? mlir::NVVM::MMATypes::bf16 : mlir::NVVM::MMATypes::f16;
    mlir::Value d = mlir::NVVM::MmaOp::create(
        b, loc, result, va, vb, mlir::ValueRange{c[0], c[1], c[2], c[3]}, llvm::ArrayRef<int64_t>{kM, kN, kK},
        std::nullopt, std::nullopt, std::array<mlir::NVVM::MMATypes, 2>{type, type},
        std::array<mlir::NVVM::MMALayout, 2>{mlir::NVVM::MMALayout::row, mlir::NVVM::MMALayout::col});
    std::array<mlir::Value, 4> out;
    for (int i = 0; i < 4; ++i)
      out[i] = mlir::LLVM::ExtractValueOp::create(b, loc, d, i);
    return out;
  }

  // --- warp groups of four lanes (templates/prim/warp.cuh)
  mlir::Value quad_reduce_max(mlir::Value v) {
    for (int offset = kQuadSize / 2; offset > 0; offset /= 2)
      v = max_f32(v, shfl_xor_sync(v, offset));
    return v;
  }
  mlir::Value quad_reduce_sum(mlir::Value v) {
    for (int offset = kQuadSize / 2; offset > 0; offset /= 2)
      v = fadd(v, shfl_xor_sync(v, offset));
    return v;
  }
};

} // namespace flashjit::mlirgen
