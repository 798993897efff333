// From a chosen plan to a compiled kernel, through the selected backend, and the cache key that
// names the result.
#pragma once

#include "compiler/compiled_kernel.hpp"
#include "compiler/planner.hpp"

#include <flashjit/flashjit.hpp>

#include <string>

namespace flashjit {

// "nvrtc" | "mlir" (auto resolves to nvrtc until the MLIR backend covers the variant).
std::string backend_name(flashjit_backend backend);
flashjit_backend resolve_backend(flashjit_backend requested, Variant variant);

// 16 hex digits: xxh64 over the canonical name, the plan, the template sources, the backend and its
// version, the compile options and the flashjit version. Anything that changes code changes it.
std::string cache_key(const KernelSpec &spec, const Plan &plan, flashjit_backend backend);

Status build_kernel(const KernelSpec &spec, const Plan &plan, flashjit_backend backend, CompiledKernel *out);

} // namespace flashjit
