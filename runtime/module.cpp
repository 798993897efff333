#include "runtime/module.hpp"

#include "runtime/driver.hpp"
#include "runtime/log.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

namespace flashjit {
namespace {

// Dynamic shared memory a kernel may use without CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES.
constexpr int kSmemWithoutOptIn = 48 * 1024;
// cuModuleLoadData takes no size, so make sure the bytes at least start like an ELF64 file before
// the driver parses them.
constexpr char kElfMagic[] = {0x7f, 'E', 'L', 'F'};
constexpr size_t kElf64HeaderBytes = 64;

const driver::Api *require_api(Status *status) {
  std::string why;
  const driver::Api *cu = driver::api(&why);
  if (cu == nullptr) {
    *status = Status::error(FLASHJIT_DRIVER_ERROR, why);
  }
  return cu;
}

} // namespace

LoadedKernel::~LoadedKernel() {
  reset();
}

LoadedKernel::LoadedKernel(LoadedKernel &&other) noexcept {
  *this = std::move(other);
}

LoadedKernel &LoadedKernel::operator=(LoadedKernel &&other) noexcept {
  if (this != &other) {
    reset();
    module_ = std::exchange(other.module_, nullptr);
    function_ = std::exchange(other.function_, nullptr);
    context_ = std::exchange(other.context_, nullptr);
    entry_ = std::move(other.entry_);
    registers_ = other.registers_;
    local_bytes_ = other.local_bytes_;
    max_threads_ = other.max_threads_;
    static_smem_bytes_ = other.static_smem_bytes_;
    dynamic_smem_bytes_ = other.dynamic_smem_bytes_;
  }
  return *this;
}

void LoadedKernel::reset() {
  if (module_ != nullptr) {
    if (const driver::Api *cu = driver::api()) {
      // cuModuleUnload acts on the current context; a kernel may be destroyed on a thread where
      // another context (or none) is current, so switch to ours for the call.
      CUcontext current = nullptr;
      cu->cuCtxGetCurrent(&current);
      const bool switch_context = current != context_ && context_ != nullptr;
      if (switch_context) {
        cu->cuCtxSetCurrent(context_);
      }
      // At process exit the driver may already be shutting down (CUDA_ERROR_DEINITIALIZED): the
      // module is gone with it, so there is nothing to report.
      if (CUresult r = cu->cuModuleUnload(module_); r != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED) {
        log(LogLevel::debug, "cuModuleUnload(" + entry_ + "): " + driver::error_text(r));
      }
      if (switch_context) {
        cu->cuCtxSetCurrent(current);
      }
    }
  }
  module_ = nullptr;
  function_ = nullptr;
  context_ = nullptr;
}

Status LoadedKernel::load(std::span<const char> cubin, const std::string &entry, int dynamic_smem_bytes,
                          LoadedKernel *out) {
  Status status;
  const driver::Api *cu = require_api(&status);
  if (cu == nullptr) {
    return status;
  }
  if (cubin.size() < kElf64HeaderBytes || std::memcmp(cubin.data(), kElfMagic, sizeof(kElfMagic)) != 0) {
    return Status::error(FLASHJIT_INTERNAL,
                         "cubin for " + entry + " is not an ELF image (" + std::to_string(cubin.size()) + " bytes)");
  }
  if (dynamic_smem_bytes < 0) {
    return Status::error(FLASHJIT_INTERNAL, "negative dynamic shared memory for " + entry);
  }
  driver::DeviceInfo device;
  if (status = driver::current_device(&device); !status) {
    return status;
  }

  LoadedKernel kernel;
  kernel.entry_ = entry;
  if (CUresult r = cu->cuCtxGetCurrent(&kernel.context_); r != CUDA_SUCCESS) {
    return driver::driver_error("cuCtxGetCurrent", r);
  }
  if (CUresult r = cu->cuModuleLoadData(&kernel.module_, cubin.data()); r != CUDA_SUCCESS) {
    kernel.module_ = nullptr;
    return driver::driver_error("cuModuleLoadData(" + entry + ") on " + device.name + " (sm_" +
                                    std::to_string(device.cc_major) + std::to_string(device.cc_minor) + ")",
                                r);
  }
  if (CUresult r = cu->cuModuleGetFunction(&kernel.function_, kernel.module_, entry.c_str()); r != CUDA_SUCCESS) {
    return driver::driver_error("cuModuleGetFunction(" + entry + ")", r);
  }
  const std::pair<int *, CUfunction_attribute> attributes[] = {
      {&kernel.registers_, CU_FUNC_ATTRIBUTE_NUM_REGS},
      {&kernel.local_bytes_, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES},
      {&kernel.max_threads_, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK},
      {&kernel.static_smem_bytes_, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES},
  };
  for (const auto &[value, attribute] : attributes) {
    if (CUresult r = cu->cuFuncGetAttribute(value, attribute, kernel.function_); r != CUDA_SUCCESS) {
      return driver::driver_error("cuFuncGetAttribute(" + entry + ")", r);
    }
  }

  // Refuse here, with numbers, rather than let the launch fail later with a bare
  // CUDA_ERROR_INVALID_VALUE.
  const int needed = kernel.static_smem_bytes_ + dynamic_smem_bytes;
  if (needed > device.max_smem_optin) {
    return Status::error(FLASHJIT_OUT_OF_RESOURCES,
                         entry + " needs " + std::to_string(needed) + " bytes of shared memory per block (" +
                             std::to_string(kernel.static_smem_bytes_) + " static + " +
                             std::to_string(dynamic_smem_bytes) + " dynamic), but " + device.name + " allows at most " +
                             std::to_string(device.max_smem_optin));
  }
  if (dynamic_smem_bytes > kSmemWithoutOptIn) {
    if (CUresult r = cu->cuFuncSetAttribute(kernel.function_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                            dynamic_smem_bytes);
        r != CUDA_SUCCESS) {
      return driver::driver_error(
          "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES=" + std::to_string(dynamic_smem_bytes) + ", " + entry + ")",
          r);
    }
  }
  kernel.dynamic_smem_bytes_ = dynamic_smem_bytes;
  log(LogLevel::debug, "loaded " + entry + ": " + std::to_string(kernel.registers_) + " registers, " +
                           std::to_string(kernel.local_bytes_) + " local bytes, " +
                           std::to_string(kernel.static_smem_bytes_) + "+" + std::to_string(dynamic_smem_bytes) +
                           " smem bytes, max " + std::to_string(kernel.max_threads_) + " threads");
  *out = std::move(kernel);
  return Status::success();
}

namespace {

// The launch attributes of a cluster shape ({1,1,1}: none) and PDL, and the config that carries them.
struct LaunchAttributes {
  CUlaunchAttribute list[2] = {};
  unsigned count = 0;
  LaunchAttributes(Dim3 cluster, bool programmatic_dependent) {
    if (programmatic_dependent) {
      CUlaunchAttribute &attribute = list[count++];
      attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attribute.value.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster.x * cluster.y * cluster.z != 1) {
      CUlaunchAttribute &attribute = list[count++];
      attribute.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attribute.value.clusterDim.x = cluster.x;
      attribute.value.clusterDim.y = cluster.y;
      attribute.value.clusterDim.z = cluster.z;
    }
  }
  CUlaunchConfig config(Dim3 grid, Dim3 block, unsigned smem_bytes, CUstream stream) {
    CUlaunchConfig c = {};
    c.gridDimX = grid.x;
    c.gridDimY = grid.y;
    c.gridDimZ = grid.z;
    c.blockDimX = block.x;
    c.blockDimY = block.y;
    c.blockDimZ = block.z;
    c.sharedMemBytes = smem_bytes;
    c.hStream = stream;
    c.attrs = count > 0 ? list : nullptr;
    c.numAttrs = count;
    return c;
  }
};

} // namespace

Status LoadedKernel::max_active_clusters(Dim3 block, unsigned smem_bytes, Dim3 cluster, int *clusters) const {
  if (function_ == nullptr)
    return Status::error(FLASHJIT_INTERNAL, "occupancy query of a kernel that is not loaded");
  LaunchAttributes attributes(cluster, false);
  // The grid only has to be a whole number of clusters.
  CUlaunchConfig config = attributes.config(cluster, block, smem_bytes, nullptr);
  if (CUresult r = driver::api()->cuOccupancyMaxActiveClusters(clusters, function_, &config); r != CUDA_SUCCESS)
    return driver::driver_error("cuOccupancyMaxActiveClusters(" + entry_ + ")", r);
  return Status::success();
}

Status LoadedKernel::launch(Dim3 grid, Dim3 block, unsigned smem_bytes, CUstream stream, void **args, Dim3 cluster,
                            bool programmatic_dependent) const {
  if (function_ == nullptr) {
    return Status::error(FLASHJIT_INTERNAL, "launch of a kernel that is not loaded");
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
    return Status::success(); // nothing to do; a zero grid is an invalid launch to the driver
  }
  const unsigned long long threads = static_cast<unsigned long long>(block.x) * block.y * block.z;
  if (threads == 0 || threads > static_cast<unsigned long long>(max_threads_)) {
    return Status::error(FLASHJIT_OUT_OF_RESOURCES, entry_ + ": a block of " + std::to_string(threads) +
                                                        " threads, but the kernel (" + std::to_string(registers_) +
                                                        " registers per thread) allows 1.." +
                                                        std::to_string(max_threads_));
  }
  if (static_cast<long long>(smem_bytes) > std::max(dynamic_smem_bytes_, kSmemWithoutOptIn)) {
    return Status::error(FLASHJIT_INTERNAL, entry_ + ": launch with " + std::to_string(smem_bytes) +
                                                " bytes of dynamic shared memory, but it was loaded for " +
                                                std::to_string(dynamic_smem_bytes_));
  }
  const driver::Api *cu = driver::api(); // non-null: this kernel was loaded through it

  LaunchAttributes attributes(cluster, programmatic_dependent);
  CUlaunchConfig config = attributes.config(grid, block, smem_bytes, stream);
  if (CUresult r = cu->cuLaunchKernelEx(&config, function_, args, nullptr); r != CUDA_SUCCESS) {
    std::string what = "cuLaunchKernelEx(" + entry_ + ", grid " + std::to_string(grid.x) + "x" +
                       std::to_string(grid.y) + "x" + std::to_string(grid.z) + ", block " + std::to_string(threads) +
                       ", smem " + std::to_string(smem_bytes) + ")";
    CUcontext current = nullptr;
    if (cu->cuCtxGetCurrent(&current) == CUDA_SUCCESS && current != context_) {
      what += " [the current context is not the one the kernel was loaded in]";
    }
    return driver::driver_error(what, r);
  }
  return Status::success();
}

} // namespace flashjit
