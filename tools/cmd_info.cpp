// `flashjit info` and `flashjit explain`.
#include "tools/commands.hpp"
#include "tools/problem_options.hpp"

#include "compiler/nvrtc/nvrtc_library.hpp"
#include "runtime/disk_cache.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_store.hpp"

#include <flashjit/flashjit.h>

#include <iostream>
#include <memory>

namespace flashjit::cli {

Action add_info(CLI::App &) {
  return [] {
    std::cout << "flashjit " << flashjit_version() << "\n";
    std::string error;
    if (const driver::Api *api = driver::api(&error)) {
      int driver_version = 0, count = 0;
      api->cuDriverGetVersion(&driver_version);
      api->cuDeviceGetCount(&count);
      std::cout << "driver:   CUDA " << driver_version / 1000 << "." << (driver_version % 1000) / 10 << ", " << count
                << " device(s)\n";
      for (int i = 0; i < count; ++i) {
        CUdevice device;
        char name[256] = {};
        int major = 0, minor = 0, sms = 0;
        api->cuDeviceGet(&device, i);
        api->cuDeviceGetName(name, sizeof(name), device);
        api->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
        api->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
        api->cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
        std::cout << "gpu " << i << ":    " << name << " (sm_" << major << minor << ", " << sms << " SMs)\n";
      }
    } else {
      std::cout << "driver:   none (" << error << ")\n";
    }
    std::string nvrtc_error;
    nvrtc::api(&nvrtc_error);
    std::cout << "compiler: " << nvrtc::version_string() << (nvrtc_error.empty() ? "" : " (" + nvrtc_error + ")")
              << "\n";
#ifdef FLASHJIT_LLVM_VERSION
    std::cout << "llvm:     " << FLASHJIT_LLVM_VERSION << " (MLIR backend)\n";
#else
    std::cout << "llvm:     not built (MLIR backend off)\n";
#endif
    const StoreConfig config = store_config_from(Options());
    std::cout << "cache:    " << config.cache_dir.string();
    if (!config.disk_cache) {
      std::cout << " (disabled by FLASHJIT_CACHE=off)\n";
    } else {
      DiskCache cache(config.cache_dir);
      const DiskCache::Stats stats = cache.stats();
      std::cout << (cache.usable() ? "" : " (not writable: memory only)") << ", " << stats.entries << " kernels, "
                << stats.bytes / 1024 << " KiB\n";
    }
    return 0;
  };
}

Action add_explain(CLI::App &app) {
  auto options = std::make_shared<ProblemOptions>();
  options->add_to(app);
  return [options] {
    harness::CaseOptions c;
    std::string error;
    if (!options->to_case(&c, &error)) {
      std::cerr << "flashjit: " << error << "\n";
      return 2;
    }
    // Explaining needs shapes, strides and flags, not data: dummy aligned addresses stand in for the
    // tensors (the strides are `check`'s, so --row-padding and --head-major choose as they do there).
    AttentionProblem p;
    const ref::Problem &rp = c.problem;
    harness::describe_problem(c, &p);
    constexpr uintptr_t kPlaceholder = 1u << 20;
    p.q = p.k = p.v = reinterpret_cast<void *>(kPlaceholder);
    p.o = reinterpret_cast<void *>(kPlaceholder);
    static const int32_t cu_placeholder[1] = {0};
    if (c.varlen) {
      p.cu_seqlens_q = p.cu_seqlens_k = cu_placeholder;
      p.total_q = rp.total_q();
      p.total_k = rp.total_k();
    }
    if (c.page_size > 0) {
      p.block_table = p.seqlens_k = cu_placeholder;
      p.page_size = c.page_size;
      p.max_pages_per_seq = (p.seqlen_k + c.page_size - 1) / c.page_size;
      p.num_pages = p.max_pages_per_seq * p.batch;
      p.cu_seqlens_k = nullptr;
    }
    Runtime runtime(options->runtime_options());
    Explanation e;
    if (Status s = runtime.explain(p, &e); !s) {
      std::cerr << "flashjit: " << s.message << "\n";
      return 1;
    }
    std::cout << e.text;
    return 0;
  };
}

} // namespace flashjit::cli
