// One loaded cubin and the kernel in it: load once (per context), launch many times.
#pragma once

#include <flashjit/flashjit.hpp>

#include <cuda.h>

#include <span>
#include <string>

namespace flashjit {

struct Dim3 {
  unsigned x = 1;
  unsigned y = 1;
  unsigned z = 1;
};

// Owns a CUmodule (unloaded in the destructor) and the CUfunction of its entry point. Move-only.
// Lives in the context that was current at load(); launch it only there.
class LoadedKernel {
public:
  LoadedKernel() = default;
  ~LoadedKernel();
  LoadedKernel(LoadedKernel &&other) noexcept;
  LoadedKernel &operator=(LoadedKernel &&other) noexcept;
  LoadedKernel(const LoadedKernel &) = delete;
  LoadedKernel &operator=(const LoadedKernel &) = delete;

  // Loads `cubin` into the current context and finds `entry` (the lowered/mangled name). Opts the
  // kernel in to `dynamic_smem_bytes` of dynamic shared memory when that is above the 48 KB that
  // needs no opt-in. FLASHJIT_OUT_OF_RESOURCES, naming the need and the device limit, when static
  // + dynamic shared memory exceeds what this device allows a block; nothing is left loaded then.
  static Status load(std::span<const char> cubin, const std::string &entry, int dynamic_smem_bytes, LoadedKernel *out);

  // Launches on `stream` through cuLaunchKernelEx. A grid with a zero dimension launches nothing
  // and succeeds (an empty problem). `cluster` other than {1,1,1} launches thread-block clusters.
  // `programmatic_dependent` lets this grid start before the previous one on the stream finishes
  // (PDL, sm_90); the kernel must wait for its inputs with griddepcontrol.wait.
  Status launch(Dim3 grid, Dim3 block, unsigned smem_bytes, CUstream stream, void **args, Dim3 cluster = {},
                bool programmatic_dependent = false) const;

  // How many clusters of `cluster` CTAs of this kernel can be resident at once on the device
  // (cuOccupancyMaxActiveClusters): a persistent grid of clusters is sized to it.
  Status max_active_clusters(Dim3 block, unsigned smem_bytes, Dim3 cluster, int *clusters) const;

  bool loaded() const { return function_ != nullptr; }
  CUfunction function() const { return function_; }
  CUmodule module() const { return module_; }
  CUcontext context() const { return context_; }
  const std::string &entry() const { return entry_; }
  int registers() const { return registers_; }     // per thread
  int local_bytes() const { return local_bytes_; } // per thread; > 0 means ptxas spilled
  int max_threads() const { return max_threads_; } // per block, given the register use
  int static_smem_bytes() const { return static_smem_bytes_; }
  int dynamic_smem_bytes() const { return dynamic_smem_bytes_; } // opted in at load

private:
  void reset();

  CUmodule module_ = nullptr;
  CUfunction function_ = nullptr;
  CUcontext context_ = nullptr;
  std::string entry_;
  int registers_ = 0;
  int local_bytes_ = 0;
  int max_threads_ = 0;
  int static_smem_bytes_ = 0;
  int dynamic_smem_bytes_ = 0;
};

} // namespace flashjit
