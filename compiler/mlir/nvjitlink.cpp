#include "compiler/mlir/nvjitlink.hpp"

#include <nvJitLink.h>

#include <dlfcn.h>

#include <cstdlib>
#include <memory>

#ifndef FLASHJIT_CUDA_LIB_DIR
#define FLASHJIT_CUDA_LIB_DIR "/usr/local/cuda/lib64"
#endif

namespace flashjit::nvjitlink {
namespace {

// The header's nvJitLink* names are inline wrappers around versioned symbols; the library also
// exports the plain names, which is what we resolve.
struct Api {
  nvJitLinkResult (*create)(nvJitLinkHandle *, uint32_t, const char **);
  nvJitLinkResult (*destroy)(nvJitLinkHandle *);
  nvJitLinkResult (*add_data)(nvJitLinkHandle, nvJitLinkInputType, const void *, size_t, const char *);
  nvJitLinkResult (*complete)(nvJitLinkHandle);
  nvJitLinkResult (*cubin_size)(nvJitLinkHandle, size_t *);
  nvJitLinkResult (*cubin)(nvJitLinkHandle, void *);
  nvJitLinkResult (*error_log_size)(nvJitLinkHandle, size_t *);
  nvJitLinkResult (*error_log)(nvJitLinkHandle, char *);
  nvJitLinkResult (*info_log_size)(nvJitLinkHandle, size_t *);
  nvJitLinkResult (*info_log)(nvJitLinkHandle, char *);
  nvJitLinkResult (*version)(unsigned int *, unsigned int *);
  unsigned major = 0, minor = 0;
};

struct Loaded {
  Api api{};
  std::string error;
  bool ok = false;
};

template <typename Fn> bool resolve(void *handle, const char *symbol, Fn *out, std::string *error) {
  *out = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (!*out)
    *error = std::string("nvJitLink library lacks ") + symbol;
  return *out != nullptr;
}

Loaded load() {
  Loaded loaded;
  const char *names[] = {"libnvJitLink.so.13", "libnvJitLink.so"};
  std::vector<std::string> paths(std::begin(names), std::end(names));
  for (const char *env : {"CUDA_HOME", "CUDA_PATH"})
    if (const char *root = std::getenv(env))
      for (const char *name : names)
        paths.push_back(std::string(root) + "/lib64/" + name);
  for (const char *name : names)
    paths.push_back(std::string(FLASHJIT_CUDA_LIB_DIR) + "/" + name);
  void *handle = nullptr;
  std::string tried;
  for (const auto &path : paths) {
    if ((handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)))
      break;
    tried += (tried.empty() ? "" : ", ") + path;
  }
  if (!handle) {
    loaded.error = "nvJitLink is not available (tried " + tried + ")";
    return loaded;
  }
  Api &a = loaded.api;
  std::string &e = loaded.error;
  loaded.ok =
      resolve(handle, "nvJitLinkCreate", &a.create, &e) && resolve(handle, "nvJitLinkDestroy", &a.destroy, &e) &&
      resolve(handle, "nvJitLinkAddData", &a.add_data, &e) && resolve(handle, "nvJitLinkComplete", &a.complete, &e) &&
      resolve(handle, "nvJitLinkGetLinkedCubinSize", &a.cubin_size, &e) &&
      resolve(handle, "nvJitLinkGetLinkedCubin", &a.cubin, &e) &&
      resolve(handle, "nvJitLinkGetErrorLogSize", &a.error_log_size, &e) &&
      resolve(handle, "nvJitLinkGetErrorLog", &a.error_log, &e) &&
      resolve(handle, "nvJitLinkGetInfoLogSize", &a.info_log_size, &e) &&
      resolve(handle, "nvJitLinkGetInfoLog", &a.info_log, &e) && resolve(handle, "nvJitLinkVersion", &a.version, &e) &&
      a.version(&a.major, &a.minor) == NVJITLINK_SUCCESS;
  return loaded;
}

const Loaded &loaded() {
  static const Loaded instance = load();
  return instance;
}

std::string read_log(nvJitLinkHandle handle, nvJitLinkResult (*size_fn)(nvJitLinkHandle, size_t *),
                     nvJitLinkResult (*log_fn)(nvJitLinkHandle, char *)) {
  size_t size = 0;
  if (size_fn(handle, &size) != NVJITLINK_SUCCESS || size <= 1)
    return {};
  std::string log(size, '\0');
  log_fn(handle, log.data());
  log.resize(size - 1);
  return log;
}

} // namespace

Status ptx_to_cubin(const std::string &ptx, const std::string &arch, const std::string &name, std::vector<char> *cubin,
                    std::string *info_log) {
  const Loaded &l = loaded();
  if (!l.ok)
    return Status::error(FLASHJIT_COMPILE_ERROR, l.error);
  const Api &a = l.api;
  // -verbose makes ptxas print its resource report (registers, spills) into the info log.
  const std::string arch_option = "-arch=" + arch;
  const char *options[] = {arch_option.c_str(), "-verbose", "-Xptxas=-warn-spills"};
  nvJitLinkHandle raw = nullptr;
  if (a.create(&raw, static_cast<uint32_t>(std::size(options)), options) != NVJITLINK_SUCCESS)
    return Status::error(FLASHJIT_COMPILE_ERROR, "nvJitLink could not start a link for " + arch);
  auto destroy = [&a](nvJitLinkHandle *h) { a.destroy(h); };
  std::unique_ptr<nvJitLinkHandle, decltype(destroy)> guard(&raw, destroy);

  nvJitLinkResult result = a.add_data(raw, NVJITLINK_INPUT_PTX, ptx.data(), ptx.size(), name.c_str());
  if (result == NVJITLINK_SUCCESS)
    result = a.complete(raw);
  *info_log = read_log(raw, a.info_log_size, a.info_log);
  if (result != NVJITLINK_SUCCESS)
    return Status::error(FLASHJIT_COMPILE_ERROR, "nvJitLink rejected the PTX of " + name + " (error " +
                                                     std::to_string(int(result)) + "):\n" +
                                                     read_log(raw, a.error_log_size, a.error_log) + *info_log);
  size_t size = 0;
  if (a.cubin_size(raw, &size) != NVJITLINK_SUCCESS || size == 0)
    return Status::error(FLASHJIT_COMPILE_ERROR, "nvJitLink produced no cubin for " + name);
  cubin->resize(size);
  a.cubin(raw, cubin->data());
  return Status::success();
}

std::string version_string() {
  const Loaded &l = loaded();
  if (!l.ok)
    return "nvjitlink unavailable";
  return "nvjitlink " + std::to_string(l.api.major) + "." + std::to_string(l.api.minor);
}

} // namespace flashjit::nvjitlink
