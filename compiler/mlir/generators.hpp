// The kernel generators of the MLIR backend, one per variant (gen_<variant>.cpp). Each builds its
// kernel from the plan into a gpu.module; the backend (mlir_backend.cpp) lowers and serializes it.
#pragma once

#include "compiler/plan.hpp"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMTypes.h"

#include <flashjit/flashjit.hpp>

namespace flashjit::mlirgen {

// What the lowering must know about a built kernel: its by-value parameter block. The gpu.func
// takes it as !llvm.ptr; after lowering, the backend marks that argument
// `llvm.byval = <params struct>, nvvm.grid_constant` so PTX declares `.param .align 8 .b8 p[N]`,
// the ABI of NVRTC's `const __grid_constant__ <params> p`.
struct BuiltKernel {
  std::string entry;
  unsigned params_argument = 0;
  mlir::LLVM::LLVMStructType params_type;
  int params_bytes = 0; // sizeof the C struct in templates/kernel_params.h, checked against the layout
};

Status build_combine(mlir::gpu::GPUModuleOp module, const KernelSpec &spec, const Plan &plan, BuiltKernel *out);

} // namespace flashjit::mlirgen
