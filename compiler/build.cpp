#include "compiler/build.hpp"

#include "compiler/embedded_templates.hpp"
#include "compiler/nvrtc/nvrtc_compiler.hpp"
#include "compiler/nvrtc/nvrtc_library.hpp"
#ifdef FLASHJIT_WITH_MLIR
#include "compiler/mlir/mlir_backend.hpp"
#endif

#include <xxhash.h>

#include <cstdio>

#ifndef FLASHJIT_VERSION_STRING
#define FLASHJIT_VERSION_STRING "0.0.0"
#endif

namespace flashjit {

std::string backend_name(flashjit_backend backend) {
  return backend == FLASHJIT_BACKEND_MLIR ? "mlir" : "nvrtc";
}

flashjit_backend resolve_backend(flashjit_backend requested, Variant) {
  return requested == FLASHJIT_BACKEND_AUTO ? FLASHJIT_BACKEND_NVRTC : requested;
}

std::string cache_key(const KernelSpec &spec, const Plan &plan, flashjit_backend backend) {
  std::string record = std::string("flashjit ") + FLASHJIT_VERSION_STRING + "|" + kernel_name(spec, plan) + "|" +
                       std::to_string(kernel_hash(spec, plan)) + "|templates " + std::to_string(templates_hash()) +
                       "|" + backend_name(backend);
  if (backend == FLASHJIT_BACKEND_NVRTC) {
    record += "|" + nvrtc::version_string();
    for (const std::string &option : nvrtc_options(spec.arch, plan))
      record += "|" + option;
  }
#ifdef FLASHJIT_WITH_MLIR
  if (backend == FLASHJIT_BACKEND_MLIR) {
    // The LLVM release decides the PTX; the NVPTX target (chip, PTX ISA) is part of the code too.
    const mlirgen::Target target = mlirgen::target_for(spec.arch);
    record += "|" + mlirgen::version_string() + "|" + target.chip + "|" + target.features;
  }
#endif
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(XXH64(record.data(), record.size(), 0)));
  return hex;
}

Status build_kernel(const KernelSpec &spec, const Plan &plan, flashjit_backend backend, CompiledKernel *out) {
  if (backend == FLASHJIT_BACKEND_MLIR) {
#ifdef FLASHJIT_WITH_MLIR
    if (!mlirgen::covers(plan.variant))
      return Status::error(FLASHJIT_UNSUPPORTED,
                           std::string("the MLIR backend does not cover ") + variant_name(plan.variant) + " yet");
    return mlirgen::compile_with_mlir(spec, plan, out);
#else
    return Status::error(FLASHJIT_UNSUPPORTED, "the MLIR backend is not part of this build");
#endif
  }
  return compile_with_nvrtc(spec, plan, out);
}

} // namespace flashjit
