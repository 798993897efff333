// The CUDA driver API, opened with dlopen at first use.
//
// libflashjit never links libcuda: a program that embeds it must start (and fail with a clear
// message) on a machine without an NVIDIA driver. cuda.h from the toolkit supplies only types
// and prototypes.
//
// The Api members are named after the functions, so `api->cuMemAlloc(...)` reads like the driver
// call. cuda.h #defines many of those names to a versioned symbol (cuMemAlloc -> cuMemAlloc_v2);
// the member names go through the same macros, so a member's type is the prototype of exactly the
// version the header selects, and driver.cpp asks cuGetProcAddress for that version.
#pragma once

#include <flashjit/flashjit.hpp>

#include <cuda.h>

#include <cstddef>
#include <string>

namespace flashjit::driver {

// Every driver entry point flashjit uses. X(name) once each; driver.cpp resolves them all.
#define FLASHJIT_DRIVER_FUNCTIONS(X)                                                                                   \
  X(cuInit)                                                                                                            \
  X(cuDriverGetVersion)                                                                                                \
  X(cuDeviceGet)                                                                                                       \
  X(cuDeviceGetCount)                                                                                                  \
  X(cuDeviceGetName)                                                                                                   \
  X(cuDeviceGetAttribute)                                                                                              \
  X(cuDeviceTotalMem)                                                                                                  \
  X(cuCtxGetCurrent)                                                                                                   \
  X(cuCtxSetCurrent)                                                                                                   \
  X(cuCtxGetDevice)                                                                                                    \
  X(cuDevicePrimaryCtxRetain)                                                                                          \
  X(cuDevicePrimaryCtxRelease)                                                                                         \
  X(cuModuleLoadData)                                                                                                  \
  X(cuModuleUnload)                                                                                                    \
  X(cuModuleGetFunction)                                                                                               \
  X(cuModuleGetGlobal)                                                                                                 \
  X(cuFuncGetAttribute)                                                                                                \
  X(cuFuncSetAttribute)                                                                                                \
  X(cuLaunchKernelEx)                                                                                                  \
  X(cuOccupancyMaxActiveClusters)                                                                                      \
  X(cuLaunchKernel)                                                                                                    \
  X(cuTensorMapEncodeTiled)                                                                                            \
  X(cuGetErrorName)                                                                                                    \
  X(cuGetErrorString)                                                                                                  \
  X(cuMemAlloc)                                                                                                        \
  X(cuMemFree)                                                                                                         \
  X(cuMemcpyHtoD)                                                                                                      \
  X(cuMemcpyDtoH)                                                                                                      \
  X(cuMemsetD8)                                                                                                        \
  X(cuMemsetD32Async)                                                                                                  \
  X(cuStreamSynchronize)                                                                                               \
  X(cuCtxSynchronize)                                                                                                  \
  X(cuEventCreate)                                                                                                     \
  X(cuEventRecord)                                                                                                     \
  X(cuEventElapsedTime)                                                                                                \
  X(cuEventDestroy)                                                                                                    \
  X(cuEventSynchronize)                                                                                                \
  X(cuStreamCreate)                                                                                                    \
  X(cuStreamDestroy)                                                                                                   \
  X(cuMemcpyHtoDAsync)                                                                                                 \
  X(cuStreamBeginCapture)                                                                                              \
  X(cuStreamEndCapture)                                                                                                \
  X(cuGraphInstantiateWithFlags)                                                                                       \
  X(cuGraphLaunch)                                                                                                     \
  X(cuGraphDestroy)                                                                                                    \
  X(cuGraphExecDestroy)

struct Api {
#define FLASHJIT_DRIVER_MEMBER(name) decltype(&::name) name = nullptr;
  FLASHJIT_DRIVER_FUNCTIONS(FLASHJIT_DRIVER_MEMBER)
#undef FLASHJIT_DRIVER_MEMBER
};

// The driver, loaded and initialized (cuInit(0)) once per process, thread-safely. nullptr when
// libcuda.so.1 is absent, lacks an entry point, or cuInit fails; `error` (if given) then says
// which, e.g. "no NVIDIA driver: libcuda.so.1 could not be loaded (...)". The answer never changes
// within a process.
const Api *api(std::string *error = nullptr);

// "CUDA_ERROR_X (description)". Works without a driver for the common codes.
std::string error_text(CUresult result);

// Status for a failed driver call: FLASHJIT_DRIVER_ERROR, "<what>: CUDA_ERROR_X (description)".
Status driver_error(const std::string &what, CUresult result);

struct DeviceInfo {
  int ordinal = -1;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  int l2_bytes = 0;       // L2 cache size
  int max_smem_optin = 0; // dynamic shared memory per block a kernel may opt in to, in bytes
  size_t total_mem = 0;
  int driver_version = 0; // e.g. 13000
};

// The device of the calling thread's current context. Queried once per CUcontext and cached.
// FLASHJIT_DRIVER_ERROR when there is no driver or no current context.
Status current_device(DeviceInfo *out);

// The same for a context the caller already has (null: the no-context error); *out stays valid for
// the life of the process.
Status context_device(CUcontext context, const DeviceInfo **out);

} // namespace flashjit::driver
