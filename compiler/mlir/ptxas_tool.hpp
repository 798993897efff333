// PTX -> cubin for the MLIR backend through the CUDA toolkit's `ptxas`, in whole-program mode.
//
// Why not nvJitLink alone: nvJitLink assembles PTX as a relocatable unit (`ptxas -c`), and in that
// mode ptxas ignores `setmaxnreg` (C7504), serializes wgmma (C7512) and spills the fa3 kernels
// (1.3 KB at d128, for NVRTC's PTX as much as for ours); sm_80 kernels get more registers too.
// NVRTC assembles whole-program, so this is what makes the two backends' cubins comparable.
// mlir_backend.cpp falls back to nvJitLink (with a warning) only where no ptxas is found.
#pragma once

#include <flashjit/flashjit.hpp>

#include <string>
#include <vector>

namespace flashjit::ptxas {

// The ptxas to run: $FLASHJIT_PTXAS, $CUDA_HOME/bin/ptxas, $CUDA_PATH/bin/ptxas, then the toolkit
// flashjit was built against. Empty when none exists.
const std::string &path();

// "ptxas 13.0.88" (its --version line), or "ptxas unavailable"; part of the MLIR cache key.
const std::string &version_string();

// Assembles `ptx` for `arch` (e.g. "sm_90a") with -v, so `log` carries the resource report.
Status assemble(const std::string &ptx, const std::string &arch, const std::string &name, std::vector<char> *cubin,
                std::string *log);

} // namespace flashjit::ptxas
