// MLIR backend: the kernel of a plan built with MLIR's C++ builders (gpu, nvvm, arith, scf, llvm
// dialects), lowered in process to LLVM+NVVM, printed as PTX by LLVM's NVPTX backend, and linked to
// a cubin by nvJitLink like NVRTC output. Same plan, same entry symbol and parameter block as the
// NVRTC kernel of the variant, so the runtime loads and launches either one the same way.
//
// This header names no MLIR type: the CLI and the tests include it without LLVM on their path.
// Everything here exists only when the build has FLASHJIT_WITH_MLIR.
#pragma once

#include "compiler/compiled_kernel.hpp"
#include "compiler/plan.hpp"

#include <flashjit/flashjit.hpp>

#include <string>

namespace flashjit::mlirgen {

// An NVPTX target: LLVM chip ("sm_90a") and feature string ("+ptx80").
struct Target {
  std::string chip;
  std::string features;
};

// The target the backend compiles an arch for (the lowest PTX ISA that has every op we emit).
Target target_for(const Arch &arch);

// Rejects, before anything is lowered, a chip or PTX version that the linked LLVM does not know,
// a PTX ISA too old for the chip, or a chip that lacks what `variant` needs. The NVPTX backend
// turns such mismatches into fatal errors, so they must never reach it.
Status validate_target(const Target &target, Variant variant);

// Does the generator cover this variant yet?
bool covers(Variant variant);

// "mlir 22.1.8"
std::string version_string();

// Every stage of one generation, printed, for the stage tests and `--dump` style debugging.
struct Stages {
  std::string built;   // gpu.module as built (gpu/scf/arith/nvvm/llvm ops)
  std::string lowered; // after the NVVM pipeline: llvm.func + nvvm ops only
  std::string ptx;
  double build_seconds = 0;
  double lower_seconds = 0;
  double ptx_seconds = 0;
};

struct Options {
  // Compile for this target instead of target_for(spec.arch) (tests use it to ask for bad ones).
  Target target;
  bool use_target = false;
  // Tests only: skip validate_target so the fatal-error guard is what stands between a bad
  // target and an abort.
  bool skip_validation = false;
};

// spec + plan -> PTX, keeping every stage.
Status generate(const KernelSpec &spec, const Plan &plan, const Options &options, Stages *out);

// Runs the same pipeline (lower, serialize) on MLIR text holding one gpu.module; the target is
// attached when the module has none. For tests of the pipeline and of the fatal-error guard.
Status lower_text(const std::string &mlir_text, const Target &target, const Options &options, Stages *out);

// The backend entry used by compiler/build.cpp: PTX from generate(), then a cubin from nvJitLink,
// with ptxas's resource report parsed into out->resources.
Status compile_with_mlir(const KernelSpec &spec, const Plan &plan, CompiledKernel *out);

} // namespace flashjit::mlirgen
