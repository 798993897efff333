// The kernel generators of the MLIR backend, one per variant (gen_<variant>.cpp). Each builds its
// kernel from the plan into a gpu.module; the backend (mlir_backend.cpp) lowers and serializes it.
#pragma once

#include "compiler/plan.hpp"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMTypes.h"

#include <flashjit/flashjit.hpp>

#include <string>
#include <vector>

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
  int min_ctas = 0;     // > 0: .minnctapersm, the second __launch_bounds__ argument
};

Status build_combine(mlir::gpu::GPUModuleOp module, const KernelSpec &spec, const Plan &plan, BuiltKernel *out);

// Why the MLIR decode generator cannot build `spec` (empty: it can). Checked before anything is built.
std::string decode_unsupported_reason(const KernelSpec &spec);

// Both entries of templates/kernels/decode_splitk.cuh: fj_decode_splitk, then fj_decode_combine.
Status build_decode(mlir::gpu::GPUModuleOp module, const KernelSpec &spec, const Plan &plan,
                    std::vector<BuiltKernel> *out);

// Why the MLIR fa2 generator cannot build `spec` (empty: it can). Checked before anything is built.
std::string fa2_unsupported_reason(const KernelSpec &spec);

// The entry of templates/kernels/fa2_prefill.cuh, fj_fa2_prefill, for sm_80 and later.
Status build_fa2(mlir::gpu::GPUModuleOp module, const KernelSpec &spec, const Plan &plan, BuiltKernel *out);

// Why the MLIR fa3 generator cannot build `spec` (empty: it can). Checked before anything is built.
std::string fa3_unsupported_reason(const KernelSpec &spec);

// The entry of templates/kernels/fa3_prefill.cuh for sm_90a.
Status build_fa3(mlir::gpu::GPUModuleOp module, const KernelSpec &spec, const Plan &plan, BuiltKernel *out);

} // namespace flashjit::mlirgen
