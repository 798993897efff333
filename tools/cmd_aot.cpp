// `flashjit aot`: pre-generate kernels offline (no GPU, no driver needed).
#include "tools/commands.hpp"

#include "compiler/build.hpp"
#include "runtime/kernel_store.hpp"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

namespace flashjit::cli {
namespace {

struct AotOptions {
  std::vector<std::string> archs = {"sm90a"};
  std::vector<int> head_dims = {64, 128};
  std::vector<int> head_dims_v; // empty: same as head_dims
  std::vector<std::string> dtypes = {"bf16"};
  std::string causal = "both";
  std::vector<std::string> ops = {"prefill"};
  std::string out_dir = "flashjit-aot";
  std::vector<std::string> emit = {"cubin", "ptx"};
  int jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool no_cache = false;
};

struct Job {
  KernelSpec spec;
  std::string error;
  CompiledKernel kernel;
  PlanChoice choice;
  std::string origin;
};

bool build_jobs(const AotOptions &o, std::vector<Job> *jobs, std::string *error) {
  std::vector<bool> causal_values;
  if (o.causal == "yes" || o.causal == "both")
    causal_values.push_back(true);
  if (o.causal == "no" || o.causal == "both")
    causal_values.push_back(false);
  for (const std::string &arch_text : o.archs) {
    std::optional<Arch> arch = Arch::parse(arch_text);
    if (!arch) {
      *error = "--arch " + arch_text + ": expected sm80, sm86, sm89 or sm90a";
      return false;
    }
    for (const std::string &op : o.ops) {
      if (op != "prefill") {
        *error = "--op " + op + ": this build pre-generates prefill kernels only";
        return false;
      }
      for (size_t i = 0; i < o.head_dims.size(); ++i)
        for (const std::string &dtype : o.dtypes)
          for (bool causal : causal_values) {
            KernelSpec spec;
            spec.op = Op::prefill;
            spec.arch = *arch;
            spec.dtype = dtype == "fp16" ? FLASHJIT_FP16 : FLASHJIT_BF16;
            spec.head_dim_qk = o.head_dims[i];
            spec.head_dim_v = o.head_dims_v.empty() ? o.head_dims[i] : o.head_dims_v[std::min(i, o.head_dims_v.size() - 1)];
            spec.causal = causal;
            jobs->push_back(Job{spec});
          }
    }
  }
  return true;
}

bool write_file(const std::filesystem::path &path, const void *data, size_t size) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char *>(data), static_cast<std::streamsize>(size));
    if (!out)
      return false;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  return !ec;
}

bool wants(const AotOptions &o, const char *artifact) {
  return std::find(o.emit.begin(), o.emit.end(), artifact) != o.emit.end();
}

} // namespace

Action add_aot(CLI::App &app) {
  auto o = std::make_shared<AotOptions>();
  app.add_option("--arch", o->archs, "target archs: sm80, sm86, sm89, sm90a")->delimiter(',')->capture_default_str();
  app.add_option("--head-dim", o->head_dims, "head dims of Q/K, e.g. 64,80,128")->delimiter(',')->capture_default_str();
  app.add_option("--head-dim-v", o->head_dims_v, "head dims of V, paired with --head-dim (default: the same)")
      ->delimiter(',');
  app.add_option("--dtype", o->dtypes, "bf16, fp16")->delimiter(',')->capture_default_str();
  app.add_option("--causal", o->causal, "yes | no | both")->check(CLI::IsMember({"yes", "no", "both"}))->capture_default_str();
  app.add_option("--op", o->ops, "ops to generate: prefill")->delimiter(',')->capture_default_str();
  app.add_option("--out", o->out_dir, "output directory")->capture_default_str();
  app.add_option("--emit", o->emit, "artifacts: ptx, cubin")->delimiter(',')->capture_default_str();
  app.add_option("-j,--jobs", o->jobs, "parallel compiles (default: cores)")->capture_default_str();
  app.add_flag("--no-cache", o->no_cache, "ignore the disk cache (measure cold compiles)");
  return [o] {
    std::vector<Job> jobs;
    std::string error;
    if (!build_jobs(*o, &jobs, &error)) {
      std::cerr << "flashjit aot: " << error << "\n";
      return 2;
    }
    Options options;
    options.disk_cache = o->no_cache ? 0 : 1;
    KernelStore store(store_config_from(options));
    const auto start = std::chrono::steady_clock::now();
    std::atomic<size_t> next{0}, done{0};
    std::mutex print_mutex;
    auto worker = [&] {
      for (size_t i = next++; i < jobs.size(); i = next++) {
        Job &job = jobs[i];
        if (Status s = store.compile(job.spec, &job.kernel, &job.choice, &job.origin); !s)
          job.error = s.message;
        std::lock_guard lock(print_mutex);
        const size_t finished = ++done;
        std::cout << "[" << finished << "/" << jobs.size() << "] "
                  << (job.error.empty() ? job.kernel.name : "FAILED " + kernel_name(job.spec, job.choice.plan));
        if (job.error.empty())
          std::cout << " (" << (job.origin == "jit" ? std::to_string(static_cast<int>(job.kernel.compile_seconds * 1000)) + " ms NVRTC" : "cached")
                    << ", " << job.kernel.resources.registers << " regs, " << job.kernel.resources.spill_store_bytes
                    << " spill B)";
        std::cout << std::endl;
      }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < std::max(1, o->jobs); ++t)
      threads.emplace_back(worker);
    for (auto &t : threads)
      t.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    std::filesystem::create_directories(o->out_dir);
    nlohmann::json manifest = {{"format", "flashjit-aot-manifest"}, {"format_version", 1},
                               {"flashjit_version", flashjit_version()}, {"kernels", nlohmann::json::array()}};
    size_t failures = 0, bytes = 0;
    double slowest_cold = 0;
    for (const Job &job : jobs) {
      if (!job.error.empty()) {
        ++failures;
        std::cerr << job.error << "\n";
        continue;
      }
      const CompiledKernel &k = job.kernel;
      nlohmann::json entry = {{"name", k.name},
                              {"entry", k.entry},
                              {"arch", job.spec.arch.name()},
                              {"variant", variant_name(job.choice.plan.variant)},
                              {"backend", k.backend},
                              {"registers", k.resources.registers},
                              {"spill_store_bytes", k.resources.spill_store_bytes},
                              {"smem_bytes", job.choice.plan.smem_bytes},
                              {"threads", job.choice.plan.threads},
                              {"origin", job.origin}};
      if (job.origin == "jit") {
        entry["compile_seconds"] = k.compile_seconds;
        slowest_cold = std::max(slowest_cold, k.compile_seconds);
      }
      if (!job.choice.fallback_reason.empty())
        entry["fallback_reason"] = job.choice.fallback_reason;
      if (wants(*o, "cubin")) {
        write_file(std::filesystem::path(o->out_dir) / (k.name + ".cubin"), k.cubin.data(), k.cubin.size());
        entry["cubin"] = k.name + ".cubin";
        bytes += k.cubin.size();
      }
      if (wants(*o, "ptx") && !k.ptx.empty()) {
        write_file(std::filesystem::path(o->out_dir) / (k.name + ".ptx"), k.ptx.data(), k.ptx.size());
        entry["ptx"] = k.name + ".ptx";
        bytes += k.ptx.size();
      }
      manifest["kernels"].push_back(entry);
    }
    const std::string text = manifest.dump(2);
    write_file(std::filesystem::path(o->out_dir) / "manifest.json", text.data(), text.size());
    std::cout << "aot: " << (jobs.size() - failures) << " kernels, " << bytes / 1024 << " KiB in " << o->out_dir
              << ", " << seconds << " s wall with " << o->jobs << " jobs";
    if (slowest_cold > 0)
      std::cout << "; slowest cold NVRTC compile " << static_cast<int>(slowest_cold * 1000) << " ms";
    std::cout << (failures ? ", " + std::to_string(failures) + " FAILED" : "") << "\n";
    return failures ? 1 : 0;
  };
}

} // namespace flashjit::cli
