#include "runtime/driver.hpp"

#include "runtime/log.hpp"

#include <dlfcn.h>

#include <array>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace flashjit::driver {
namespace {

constexpr const char *kDriverLibrary = "libcuda.so.1";
// The one symbol looked up with dlsym; every other entry point comes from it, so each resolves to
// the version that matches the prototypes in our cuda.h (CUDA_VERSION), not to the oldest ABI that
// happens to carry the plain name.
constexpr const char *kProcAddressSymbol = "cuGetProcAddress_v2";
using GetProcAddress = CUresult (*)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

// Except where CUDA 13 changed a plain name's ABI without changing its prototype: cuda.h still declares
// cuCtxGetDevice(CUdevice *) and cuCtxSynchronize(void), but their 13.0 versions take a context too
// (cudaTypedefs.h: PFN_cuCtxGetDevice_v13000, PFN_cuCtxSynchronize_v13000), which a call through the old
// prototype would fill from a stray register (session 45: CUDA_ERROR_CONTEXT_IS_DESTROYED). Those are
// asked for as of CUDA 12, whose versions match the prototypes.
constexpr int kBeforeContextArguments = 12000;
constexpr std::array<std::string_view, 2> kContextArgumentIn13 = {"cuCtxGetDevice", "cuCtxSynchronize"};

int requested_version(std::string_view name) {
  for (std::string_view changed : kContextArgumentIn13)
    if (name == changed)
      return CUDA_VERSION < kBeforeContextArguments ? CUDA_VERSION : kBeforeContextArguments;
  return CUDA_VERSION;
}

struct Loaded {
  Api api;
  bool ok = false;
  std::string error;
};

std::string text_with(const Api *api, CUresult result);

std::string proc_status_text(CUresult result, CUdriverProcAddressQueryResult status) {
  if (result != CUDA_SUCCESS) {
    return "cuGetProcAddress failed with " + text_with(nullptr, result);
  }
  switch (status) {
  case CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: return "not found";
  case CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: return "the driver is older than this entry point";
  default: return "null address";
  }
}

Loaded load_driver() {
  Loaded loaded;
  // RTLD_LOCAL: the driver's symbols stay out of the global namespace, where they could capture
  // calls meant for another copy of libcuda. The handle is never closed (the driver is not
  // designed to be unloaded; the CUDA runtime does not close it either).
  void *handle = dlopen(kDriverLibrary, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char *why = dlerror();
    loaded.error = std::string("no NVIDIA driver: ") + kDriverLibrary + " could not be loaded (" +
                   (why != nullptr ? why : "unknown reason") + ")";
    return loaded;
  }
  auto get_proc = reinterpret_cast<GetProcAddress>(dlsym(handle, kProcAddressSymbol));
  if (get_proc == nullptr) {
    loaded.error = std::string("NVIDIA driver too old: ") + kDriverLibrary + " has no " + kProcAddressSymbol +
                   " (CUDA 12.0 or newer is needed)";
    return loaded;
  }
  // The toolkit's stub (for linking without a driver) answers every call with this code.
  CUdriverProcAddressQueryResult probe_status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  void *probe = nullptr;
  if (get_proc("cuInit", &probe, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &probe_status) == CUDA_ERROR_STUB_LIBRARY) {
    loaded.error = std::string("no NVIDIA driver: ") + kDriverLibrary +
                   " is the CUDA toolkit's stub library, not a driver (check LD_LIBRARY_PATH)";
    return loaded;
  }
  Api &api = loaded.api;
#define FLASHJIT_DRIVER_RESOLVE(name)                                                                                  \
  {                                                                                                                    \
    void *address = nullptr;                                                                                           \
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;                                      \
    const CUresult result = get_proc(#name, &address, requested_version(#name), CU_GET_PROC_ADDRESS_DEFAULT, &status); \
    if (result != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || address == nullptr) {                       \
      loaded.error = std::string("NVIDIA driver lacks ") + #name + " (" + proc_status_text(result, status) + ")";      \
      return loaded;                                                                                                   \
    }                                                                                                                  \
    api.name = reinterpret_cast<decltype(api.name)>(address);                                                          \
  }
  FLASHJIT_DRIVER_FUNCTIONS(FLASHJIT_DRIVER_RESOLVE)
#undef FLASHJIT_DRIVER_RESOLVE

  const CUresult init = api.cuInit(0);
  if (init != CUDA_SUCCESS) {
    loaded.error = "the NVIDIA driver could not be initialized: cuInit failed with " + text_with(&api, init);
    return loaded;
  }
  int version = 0;
  if (api.cuDriverGetVersion(&version) == CUDA_SUCCESS) {
    log(LogLevel::debug, "CUDA driver " + std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10) +
                             " loaded from " + kDriverLibrary);
  }
  loaded.ok = true;
  return loaded;
}

const Loaded &loaded() {
  // A function-local static: initialized once, thread-safely, on first use. Leaked so that
  // kernels unloaded by other static destructors at exit can still reach the driver.
  static const Loaded *instance = new Loaded(load_driver());
  return *instance;
}

// Names and descriptions of the codes most likely to reach a user, for when the driver (whose
// cuGetErrorName knows them all) is absent or was never loaded.
struct KnownError {
  CUresult code;
  const char *name;
  const char *description;
};
constexpr std::array kKnownErrors = {
    KnownError{CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    KnownError{CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    KnownError{CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    KnownError{CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    KnownError{CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    KnownError{CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    KnownError{CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    KnownError{CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    KnownError{CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    KnownError{CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU",
               "no kernel image is available for "
               "execution on the device"},
    KnownError{CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
               "the provided PTX was compiled with an unsupported toolchain"},
    KnownError{CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    KnownError{CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    KnownError{CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    KnownError{CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
               "too many resources requested for launch"},
    KnownError{CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    KnownError{CUDA_ERROR_ILLEGAL_INSTRUCTION, "CUDA_ERROR_ILLEGAL_INSTRUCTION",
               "an illegal instruction was "
               "encountered"},
    KnownError{CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    KnownError{CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    KnownError{CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
};

std::string text_with(const Api *api, CUresult result) {
  if (api != nullptr) {
    const char *name = nullptr;
    const char *description = nullptr;
    if (api->cuGetErrorName(result, &name) == CUDA_SUCCESS && name != nullptr) {
      api->cuGetErrorString(result, &description);
      return std::string(name) + " (" + (description != nullptr ? description : "no description") + ")";
    }
  }
  for (const KnownError &known : kKnownErrors) {
    if (known.code == result) {
      return std::string(known.name) + " (" + known.description + ")";
    }
  }
  return "CUresult " + std::to_string(static_cast<int>(result)) + " (unknown error code)";
}

} // namespace

const Api *api(std::string *error) {
  const Loaded &state = loaded();
  if (!state.ok) {
    if (error != nullptr) {
      *error = state.error;
    }
    return nullptr;
  }
  return &state.api;
}

std::string error_text(CUresult result) {
  return text_with(api(), result);
}

Status driver_error(const std::string &what, CUresult result) {
  return Status::error(FLASHJIT_DRIVER_ERROR, what + ": " + error_text(result));
}

namespace {

// The device of `context`, queried from the driver (its attribute queries cost microseconds each).
Status query_device(const Api *cu, DeviceInfo *out) {
  DeviceInfo info;
  CUdevice device = 0;
  if (CUresult r = cu->cuCtxGetDevice(&device); r != CUDA_SUCCESS) {
    return driver_error("cuCtxGetDevice", r);
  }
  info.ordinal = static_cast<int>(device);
  constexpr int kNameCapacity = 256;
  std::array<char, kNameCapacity> name{};
  if (CUresult r = cu->cuDeviceGetName(name.data(), kNameCapacity, device); r != CUDA_SUCCESS) {
    return driver_error("cuDeviceGetName", r);
  }
  info.name = name.data();
  const std::pair<int *, CUdevice_attribute> attributes[] = {
      {&info.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR},
      {&info.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR},
      {&info.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT},
      {&info.max_smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN},
      {&info.l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE},
  };
  for (const auto &[value, attribute] : attributes) {
    if (CUresult r = cu->cuDeviceGetAttribute(value, attribute, device); r != CUDA_SUCCESS) {
      return driver_error("cuDeviceGetAttribute(" + std::to_string(static_cast<int>(attribute)) + ")", r);
    }
  }
  if (CUresult r = cu->cuDeviceTotalMem(&info.total_mem, device); r != CUDA_SUCCESS) {
    return driver_error("cuDeviceTotalMem", r);
  }
  if (CUresult r = cu->cuDriverGetVersion(&info.driver_version); r != CUDA_SUCCESS) {
    return driver_error("cuDriverGetVersion", r);
  }
  *out = std::move(info);
  return Status::success();
}

} // namespace

Status context_device(CUcontext context, const DeviceInfo **out) {
  // forward() asks on every call, so the answer is remembered per context: entries are never
  // removed (unordered_map keeps their addresses), and each thread keeps its last one, which needs
  // no lock. A context handle reused after cuCtxDestroy names the same device in practice (primary
  // contexts are per device), so a stale entry is harmless.
  thread_local CUcontext last_context = nullptr;
  thread_local const DeviceInfo *last_info = nullptr;
  if (context != nullptr && context == last_context) {
    *out = last_info;
    return Status::success();
  }
  std::string why;
  const Api *cu = api(&why);
  if (cu == nullptr) {
    return Status::error(FLASHJIT_DRIVER_ERROR, why);
  }
  if (context == nullptr) {
    return Status::error(FLASHJIT_DRIVER_ERROR,
                         "no current CUDA context on this thread: make a context current (e.g. cudaSetDevice, or "
                         "cuDevicePrimaryCtxRetain + cuCtxSetCurrent) before calling flashjit");
  }
  static std::mutex mutex;
  static auto *cache = new std::unordered_map<CUcontext, DeviceInfo>();
  {
    std::lock_guard lock(mutex);
    if (auto it = cache->find(context); it != cache->end()) {
      last_context = context;
      last_info = &it->second;
      *out = last_info;
      return Status::success();
    }
  }
  DeviceInfo info;
  if (Status s = query_device(cu, &info); !s) {
    return s;
  }
  std::lock_guard lock(mutex);
  const DeviceInfo *cached = &cache->try_emplace(context, std::move(info)).first->second;
  last_context = context;
  last_info = cached;
  *out = cached;
  return Status::success();
}

Status current_device(DeviceInfo *out) {
  std::string why;
  const Api *cu = api(&why);
  if (cu == nullptr) {
    return Status::error(FLASHJIT_DRIVER_ERROR, why);
  }
  CUcontext context = nullptr;
  if (CUresult r = cu->cuCtxGetCurrent(&context); r != CUDA_SUCCESS) {
    return driver_error("cuCtxGetCurrent", r);
  }
  const DeviceInfo *info = nullptr;
  if (Status s = context_device(context, &info); !s) {
    return s;
  }
  *out = *info;
  return Status::success();
}

} // namespace flashjit::driver
