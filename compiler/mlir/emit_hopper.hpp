// Hopper (sm_90a) device primitives of the MLIR backend, the counterparts of templates/prim/
// {wgmma,tma,mbarrier,setmaxnreg,named_barrier,fence}.cuh: one small function per PTX instruction
// family, named after it, with its PTX in a one-line comment. Shared-memory operands are 32-bit
// shared-window addresses (i32), as in the templates. Where LLVM 22's NVVM dialect has an op that
// takes such operands (wgmma fence/commit/wait, setmaxnreg, bar.sync/bar.arrive with a thread
// count, fence.proxy, cp.async.bulk groups) it is used; the rest is llvm.inline_asm with the
// templates' PTX text: wgmma with A in registers has no NVVM op, and the NVVM TMA / mbarrier ops
// take 64-bit pointers in the cluster window, which would add conversions the templates do not have.
#pragma once

#include "compiler/mlir/emit.hpp"

#include <string>

namespace flashjit::mlirgen {

constexpr int kWgmmaM = 64;                  // rows of one wgmma (one warpgroup)
constexpr int kWgmmaK = 16;                  // K of one wgmma for 16-bit inputs
constexpr int kWarpgroupThreads = 128;       // four warps
constexpr int kWgmmaDescUnitShift = 4;       // descriptor fields count 16-byte units
constexpr uint64_t kWgmmaDescField = 0x3FFF; // 14-bit address / offset fields
constexpr int kWgmmaDescLeadShift = 16;
constexpr int kWgmmaDescStrideShift = 32;
constexpr int kWgmmaDescSwizzleShift = 62;

struct HopperEmitter : Emitter {
  mlir::Value field(mlir::Value aggregate, int i) { return mlir::LLVM::ExtractValueOp::create(b, loc, aggregate, i); }

  // --- integer helpers on shared addresses / descriptors
  mlir::Value shl(mlir::Value x, mlir::Value y) { return mlir::arith::ShLIOp::create(b, loc, x, y); }
  mlir::Value shr_u(mlir::Value x, mlir::Value y) { return mlir::arith::ShRUIOp::create(b, loc, x, y); }
  mlir::Value or_(mlir::Value x, mlir::Value y) { return mlir::arith::OrIOp::create(b, loc, x, y); }
  mlir::Value xor_(mlir::Value x, mlir::Value y) { return mlir::arith::XOrIOp::create(b, loc, x, y); }
  mlir::Value zext64(mlir::Value x) { return mlir::arith::ExtUIOp::create(b, loc, i64(), x); }
  mlir::Value div_u(mlir::Value x, mlir::Value y) { return mlir::arith::DivUIOp::create(b, loc, x, y); }
  mlir::Value rem_u(mlir::Value x, mlir::Value y) { return mlir::arith::RemUIOp::create(b, loc, x, y); }
  mlir::Value c_bool(bool v) { return mlir::arith::ConstantIntOp::create(b, loc, i1(), v ? 1 : 0); }
  mlir::Value or_i1(mlir::Value x, mlir::Value y) { return or_(x, y); }

  // The 32-bit shared-window address of a ptr<3> (cvta.to.shared + cvt.u32.u64).
  mlir::Value shared_u32(mlir::Value ptr3) {
    mlir::Value wide = mlir::LLVM::PtrToIntOp::create(b, loc, i64(), ptr3);
    return mlir::arith::TruncIOp::create(b, loc, i32(), wide);
  }

  // shfl.sync.idx.b32 d, a, src_lane, 0x1f, 0xffffffff
  mlir::Value shfl_idx_sync(mlir::Value v, int src_lane) {
    return mlir::NVVM::ShflOp::create(
        b, loc, v.getType(), c_i32(int32_t(kFullMask)), v, c_i32(src_lane), c_i32(kShflClamp),
        mlir::NVVM::ShflKindAttr::get(b.getContext(), mlir::NVVM::ShflKind::idx), mlir::UnitAttr{});
  }

  // --- wgmma (templates/prim/wgmma.cuh)
  // Shared-memory matrix descriptor: start address, leading / stride byte offsets (>> 4, 14 bits
  // each) and the swizzle mode in bits 62-63; base offset 0 (tiles are swizzle-atom aligned).
  mlir::Value wgmma_desc(mlir::Value smem_addr, int64_t lead_bytes, int64_t stride_bytes, int64_t swizzle_mode) {
    mlir::Value start = and_(shr_u(zext64(smem_addr), c_i64(kWgmmaDescUnitShift)), c_i64(kWgmmaDescField));
    const uint64_t fixed =
        (((uint64_t(lead_bytes) >> kWgmmaDescUnitShift) & kWgmmaDescField) << kWgmmaDescLeadShift) |
        (((uint64_t(stride_bytes) >> kWgmmaDescUnitShift) & kWgmmaDescField) << kWgmmaDescStrideShift) |
        (uint64_t(swizzle_mode) << kWgmmaDescSwizzleShift);
    return or_(start, c_i64(int64_t(fixed)));
  }
  // wgmma.fence.sync.aligned
  void wgmma_fence() { mlir::NVVM::WgmmaFenceAlignedOp::create(b, loc); }
  // wgmma.commit_group.sync.aligned
  void wgmma_commit_group() { mlir::NVVM::WgmmaGroupSyncAlignedOp::create(b, loc); }
  // wgmma.wait_group.sync.aligned N
  void wgmma_wait_group(int pending) { mlir::NVVM::WgmmaWaitGroupSyncOp::create(b, loc, b.getI64IntegerAttr(pending)); }
  // (no instruction) an empty asm that re-defines a register once an asynchronous wgmma is known
  // to be complete, so nothing reads or reuses it earlier: the templates' wgmma_fence_operand.
  mlir::Value wgmma_fence_operand(mlir::Value x) {
    return asm_value(x.getType(), mlir::ValueRange{x}, "", x.getType().isF32() ? "=f,0,~{memory}" : "=r,0,~{memory}");
  }
  // (no instruction) the same value, re-defined by an empty asm volatile where it is used: values
  // derived from it are then computed here instead of being hoisted out of the persistent tile loop
  // by LLVM's LICM, which would keep them in registers across the main loop (NVRTC recomputes them).
  mlir::Value here(mlir::Value x) {
    return asm_value(x.getType(), mlir::ValueRange{x}, "", x.getType().isF32() ? "=f,0" : "=r,0");
  }
  void wgmma_fence_operands(std::vector<mlir::Value> &xs) {
    for (mlir::Value &x : xs)
      x = wgmma_fence_operand(x);
  }

  static std::string wgmma_shape(int n, DType dtype) {
    const char *t = dtype == DType::bf16 ? "bf16" : "f16";
    return "wgmma.mma_async.sync.aligned.m64n" + std::to_string(n) + "k16.f32." + t + "." + t + " ";
  }
  static std::string reg_list(int first, int count) {
    std::string s = "{";
    for (int i = 0; i < count; ++i)
      s += (i ? ", $" : "$") + std::to_string(first + i);
    return s + "}";
  }
  // `d` (n/2 f32) tied in and out; with `accumulate` false the old d is not read (scale-d = 0) and
  // not passed.
  std::vector<mlir::Value> wgmma_asm(int n, const std::string &ptx_operands, mlir::ValueRange inputs,
                                     const std::string &input_constraints, DType dtype,
                                     const std::vector<mlir::Value> &d, bool accumulate) {
    const int regs = n / 2;
    std::string ptx = "{.reg .pred p; setp.ne.b32 p, " + std::string(accumulate ? "1" : "0") + ", 0;\n" +
                      wgmma_shape(n, dtype) + reg_list(0, regs) + ", " + ptx_operands + ";}\n";
    std::string constraints;
    for (int i = 0; i < regs; ++i)
      constraints += "=f,";
    constraints += input_constraints;
    llvm::SmallVector<mlir::Value> operands(inputs.begin(), inputs.end());
    if (accumulate)
      for (int i = 0; i < regs; ++i) {
        constraints += "," + std::to_string(i);
        operands.push_back(d[i]);
      }
    constraints += ",~{memory}";
    llvm::SmallVector<mlir::Type> types(regs, f32());
    mlir::Type result = mlir::LLVM::LLVMStructType::getLiteral(b.getContext(), types);
    mlir::Value out = asm_value(result, operands, ptx, constraints);
    std::vector<mlir::Value> r(regs);
    for (int i = 0; i < regs; ++i)
      r[i] = field(out, i);
    return r;
  }
  // wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T {d}, desc_a, desc_b, p, 1, 1, 0, trans_b — SS form
  std::vector<mlir::Value> wgmma_ss(int n, DType dtype, int trans_b, const std::vector<mlir::Value> &d,
                                    mlir::Value desc_a, mlir::Value desc_b, bool accumulate) {
    const int regs = n / 2;
    const std::string operands =
        "$" + std::to_string(regs) + ", $" + std::to_string(regs + 1) + ", p, 1, 1, 0, " + std::to_string(trans_b);
    return wgmma_asm(n, operands, mlir::ValueRange{desc_a, desc_b}, "l,l", dtype, d, accumulate);
  }
  // wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T {d}, {a0..a3}, desc_b, p, 1, 1, trans_b — RS form
  std::vector<mlir::Value> wgmma_rs(int n, DType dtype, int trans_b, const std::vector<mlir::Value> &d,
                                    const std::array<mlir::Value, 4> &a, mlir::Value desc_b) {
    const int regs = n / 2;
    const std::string operands =
        reg_list(regs, 4) + ", $" + std::to_string(regs + 4) + ", p, 1, 1, " + std::to_string(trans_b);
    return wgmma_asm(n, operands, mlir::ValueRange{a[0], a[1], a[2], a[3], desc_b}, "r,r,r,r,l", dtype, d, true);
  }

  // --- mbarrier (templates/prim/mbarrier.cuh); `bar` is a shared address
  // mbarrier.init.shared::cta.b64 [bar], count
  void mbarrier_init(mlir::Value bar, mlir::Value count) {
    asm_void({bar, count}, "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}");
  }
  // mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes
  void mbarrier_arrive_expect_tx(mlir::Value bar, mlir::Value bytes) {
    asm_void({bar, bytes}, "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r,~{memory}");
  }
  // mbarrier.arrive.shared::cta.b64 _, [bar]
  void mbarrier_arrive(mlir::Value bar) { asm_void({bar}, "mbarrier.arrive.shared::cta.b64 _, [$0];", "r,~{memory}"); }
  // mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity (as 0 / 1)
  mlir::Value mbarrier_try_wait_parity(mlir::Value bar, mlir::Value parity) {
    return asm_value(
        i32(), {bar, parity},
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2;\nselp.u32 $0, 1, 0, p;\n}",
        "=r,r,r,~{memory}");
  }
  // Spins on try_wait until the phase of this parity has completed.
  void mbarrier_wait_parity(mlir::Value bar, mlir::Value parity) {
    auto loop = mlir::scf::WhileOp::create(b, loc, mlir::TypeRange{}, mlir::ValueRange{});
    {
      mlir::OpBuilder::InsertionGuard guard(b);
      mlir::Block *before = b.createBlock(&loop.getBefore());
      b.setInsertionPointToStart(before);
      mlir::Value done = mlir::arith::CmpIOp::create(b, loc, mlir::arith::CmpIPredicate::eq,
                                                     mbarrier_try_wait_parity(bar, parity), c_i32(0));
      mlir::scf::ConditionOp::create(b, loc, done, mlir::ValueRange{});
      mlir::Block *after = b.createBlock(&loop.getAfter());
      b.setInsertionPointToStart(after);
      mlir::scf::YieldOp::create(b, loc);
    }
  }
  // fence.mbarrier_init.release.cluster
  void fence_mbarrier_init() { mlir::NVVM::FenceMbarrierInitOp::create(b, loc); }
  // fence.proxy.async.shared::cta
  void fence_proxy_async_shared() {
    mlir::NVVM::FenceProxyOp::create(
        b, loc, mlir::NVVM::ProxyKindAttr::get(b.getContext(), mlir::NVVM::ProxyKind::async_shared),
        mlir::NVVM::SharedSpaceAttr::get(b.getContext(), mlir::NVVM::SharedSpace::shared_cta));
  }

  // --- TMA (templates/prim/tma.cuh); `map` is the generic address of a __grid_constant__ CUtensorMap
  // prefetch.tensormap [map]
  void tma_prefetch_descriptor(mlir::Value map) { asm_void({map}, "prefetch.tensormap [$0];", "l,~{memory}"); }
  // cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint
  //   [dst], [map, {c0, c1, c2, c3}], [bar], policy
  void tma_load_4d(mlir::Value dst, mlir::Value map, mlir::Value bar, mlir::Value c0, mlir::Value c1, mlir::Value c2,
                   mlir::Value c3, mlir::Value policy) {
    asm_void({dst, map, c0, c1, c2, c3, bar, policy},
             "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
             " [$0], [$1, {$2, $3, $4, $5}], [$6], $7;",
             "r,l,r,r,r,r,r,l,~{memory}");
  }
  // cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [map, {c0, c1, c2, c3}], [src]
  void tma_store_4d(mlir::Value map, mlir::Value src, mlir::Value c0, mlir::Value c1, mlir::Value c2, mlir::Value c3) {
    asm_void({map, c0, c1, c2, c3, src},
             "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [$0, {$1, $2, $3, $4}], [$5];",
             "l,r,r,r,r,r,~{memory}");
  }
  // cp.async.bulk.commit_group
  void tma_store_commit_group() { mlir::NVVM::CpAsyncBulkCommitGroupOp::create(b, loc); }
  // cp.async.bulk.wait_group.read N / cp.async.bulk.wait_group N
  void tma_store_wait(int pending, bool read_only) {
    mlir::NVVM::CpAsyncBulkWaitGroupOp::create(b, loc, b.getI32IntegerAttr(pending),
                                               read_only ? b.getUnitAttr() : mlir::UnitAttr{});
  }

  // --- setmaxnreg (templates/prim/setmaxnreg.cuh)
  // setmaxnreg.inc.sync.aligned.u32 N / setmaxnreg.dec.sync.aligned.u32 N
  void setmaxnreg(int regs, bool increase) {
    mlir::NVVM::SetMaxRegisterOp::create(b, loc, b.getI32IntegerAttr(regs),
                                         mlir::NVVM::SetMaxRegisterActionAttr::get(
                                             b.getContext(), increase ? mlir::NVVM::SetMaxRegisterAction::increase
                                                                      : mlir::NVVM::SetMaxRegisterAction::decrease));
  }

  // --- named barriers (templates/prim/named_barrier.cuh)
  // bar.sync id, count
  void named_barrier_sync(mlir::Value id, int count) {
    mlir::NVVM::BarrierOp::create(b, loc, mlir::Type{}, id, c_i32(count), mlir::NVVM::BarrierReductionAttr{},
                                  mlir::Value{});
  }
  // bar.arrive id, count
  void named_barrier_arrive(mlir::Value id, int count) {
    mlir::NVVM::BarrierArriveOp::create(b, loc, id, c_i32(count));
  }

  // --- shared memory (templates/kernels/fa3/epilogue.cuh)
  // stmatrix.sync.aligned.m8n8.x4.shared.b16 [addr], {r0, r1, r2, r3}
  void stmatrix_x4(mlir::Value addr, mlir::Value r0, mlir::Value r1, mlir::Value r2, mlir::Value r3) {
    asm_void({addr, r0, r1, r2, r3}, "stmatrix.sync.aligned.m8n8.x4.shared.b16 [$0], {$1, $2, $3, $4};",
             "r,r,r,r,r,~{memory}");
  }
  // stmatrix.sync.aligned.m8n8.x2.shared.b16 [addr], {r0, r1}
  void stmatrix_x2(mlir::Value addr, mlir::Value r0, mlir::Value r1) {
    asm_void({addr, r0, r1}, "stmatrix.sync.aligned.m8n8.x2.shared.b16 [$0], {$1, $2};", "r,r,r,~{memory}");
  }
  // ld.shared.v4.b32 {d0..d3}, [addr]
  std::array<mlir::Value, 4> ld_shared_v4_b32(mlir::Value addr) {
    mlir::Type result = mlir::LLVM::LLVMStructType::getLiteral(b.getContext(), {i32(), i32(), i32(), i32()});
    mlir::Value v = asm_value(result, {addr}, "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r,~{memory}");
    return {field(v, 0), field(v, 1), field(v, 2), field(v, 3)};
  }
  // st.global.v4.b32 [a], {b0..b3}
  void st_global_v4_b32(mlir::Value address, const std::array<mlir::Value, 4> &v) {
    mlir::Value vec = mlir::vector::FromElementsOp::create(b, loc, mlir::VectorType::get({kVec4}, i32()),
                                                           mlir::ValueRange{v[0], v[1], v[2], v[3]});
    st_global_v4(address, vec);
  }
};

} // namespace flashjit::mlirgen
