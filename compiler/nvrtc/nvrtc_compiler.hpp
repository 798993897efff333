// NVRTC backend: generated source -> PTX + cubin for one arch, with ptxas's resource report.
#pragma once

#include "compiler/compiled_kernel.hpp"
#include "compiler/plan.hpp"

#include <flashjit/flashjit.hpp>

#include <string>
#include <vector>

namespace flashjit {

// The exact NVRTC options for an arch and plan (part of the cache key): a plan's kPtxasOptLevel
// lowers ptxas's optimization level.
std::vector<std::string> nvrtc_options(const Arch &arch, const Plan &plan);

// Compiles `spec` realized by `plan`. On failure the message names the kernel and carries the log.
Status compile_with_nvrtc(const KernelSpec &spec, const Plan &plan, CompiledKernel *out);

} // namespace flashjit
