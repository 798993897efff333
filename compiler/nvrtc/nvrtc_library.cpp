#include "compiler/nvrtc/nvrtc_library.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#ifndef FLASHJIT_CUDA_LIB_DIR
#define FLASHJIT_CUDA_LIB_DIR "/usr/local/cuda/lib64"
#endif

namespace flashjit::nvrtc {
namespace {

struct Loaded {
  Api api{};
  std::string error;
  bool ok = false;
};

std::vector<std::string> candidates() {
  // FLASHJIT_NVRTC_PATH names the one library to load (tests set it to /nonexistent to prove a
  // bundle serves kernels on a machine without NVRTC).
  if (const char *path = std::getenv("FLASHJIT_NVRTC_PATH"); path && *path)
    return {path};
  std::vector<std::string> names = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
  std::vector<std::string> paths = names; // the loader's own search first (LD_LIBRARY_PATH, rpath)
  for (const char *env : {"CUDA_HOME", "CUDA_PATH"})
    if (const char *root = std::getenv(env))
      for (const auto &name : names)
        paths.push_back(std::string(root) + "/lib64/" + name);
  for (const auto &name : names)
    paths.push_back(std::string(FLASHJIT_CUDA_LIB_DIR) + "/" + name);
  return paths;
}

template <typename Fn> bool resolve(void *handle, const char *symbol, Fn *out, std::string *error) {
  *out = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (!*out)
    *error = std::string("NVRTC library lacks ") + symbol;
  return *out != nullptr;
}

Loaded load() {
  Loaded loaded;
  void *handle = nullptr;
  std::string tried;
  for (const auto &path : candidates()) {
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle)
      break;
    tried += (tried.empty() ? "" : ", ") + path;
  }
  if (!handle) {
    loaded.error =
        "NVRTC is not available (tried " + tried + "): install the CUDA toolkit's NVRTC or serve kernels from a bundle";
    return loaded;
  }
  Api &a = loaded.api;
  std::string &e = loaded.error;
  bool ok =
      resolve(handle, "nvrtcVersion", &a.version, &e) && resolve(handle, "nvrtcGetErrorString", &a.error_string, &e) &&
      resolve(handle, "nvrtcCreateProgram", &a.create_program, &e) &&
      resolve(handle, "nvrtcDestroyProgram", &a.destroy_program, &e) &&
      resolve(handle, "nvrtcCompileProgram", &a.compile_program, &e) &&
      resolve(handle, "nvrtcGetProgramLogSize", &a.get_log_size, &e) &&
      resolve(handle, "nvrtcGetProgramLog", &a.get_log, &e) &&
      resolve(handle, "nvrtcGetPTXSize", &a.get_ptx_size, &e) && resolve(handle, "nvrtcGetPTX", &a.get_ptx, &e) &&
      resolve(handle, "nvrtcGetCUBINSize", &a.get_cubin_size, &e) && resolve(handle, "nvrtcGetCUBIN", &a.get_cubin, &e);
  if (ok)
    ok = a.version(&a.major, &a.minor) == NVRTC_SUCCESS;
  loaded.ok = ok;
  return loaded;
}

const Loaded &loaded() {
  static const Loaded instance = load();
  return instance;
}

} // namespace

const Api *api(std::string *error) {
  const Loaded &l = loaded();
  if (!l.ok) {
    if (error)
      *error = l.error;
    return nullptr;
  }
  return &l.api;
}

std::string version_string() {
  const Api *a = api();
  if (!a)
    return "nvrtc unavailable";
  return "nvrtc " + std::to_string(a->major) + "." + std::to_string(a->minor);
}

} // namespace flashjit::nvrtc
