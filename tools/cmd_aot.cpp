// `flashjit aot`: pre-generate kernels offline (no GPU, no driver needed) into a deployment bundle.
//
// Specs come from the command line (a cross product of the options) and/or a JSON file (--specs)
// listing the shapes an engine serves. Compiles run in parallel through the kernel store, so an
// unchanged kernel is reused from the disk cache. The output is deterministic for the same inputs:
// the manifest is sorted and has no timestamps or compile times.
#include "tools/commands.hpp"

#include "compiler/build.hpp"
#include "compiler/planner.hpp"
#include "runtime/bundle.hpp"
#include "runtime/kernel_store.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

namespace flashjit::cli {
namespace {
using nlohmann::json;

constexpr double kBytesPerKiB = 1024.0;
constexpr int kMillisecondsPerSecond = 1000;

// One cross product of shapes: every arch x op x dtype x head dim x causal x page size x group x q_len.
struct ShapeSet {
  std::vector<std::string> archs = {"sm90a"};
  std::vector<std::string> ops = {"prefill"};
  std::vector<std::string> dtypes = {"bf16"};
  std::vector<std::pair<int, int>> head_dims = {{64, 64}, {128, 128}}; // (qk, v)
  std::vector<bool> causal = {true, false};
  std::vector<int> page_sizes = {0};
  std::vector<int> gqa_groups = {1}; // decode only
  std::vector<int> q_lens = {1};     // decode only
  std::vector<bool> varlen = {false};
};

struct AotOptions {
  ShapeSet cli;
  std::vector<int> head_dims = {64, 128};
  std::vector<int> head_dims_v; // empty: same as head_dims
  std::string causal = "both";
  std::string specs_file;
  std::string out_dir = "flashjit-aot";
  std::string bundle_file;
  std::vector<std::string> emit = {"cubin"};
  int jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool no_cache = false;
  bool quiet = false;
  std::string backend = "auto";
  std::string variant = "auto";
};

struct Job {
  KernelSpec spec;
  std::string error;
  CompiledKernel kernel;
  PlanChoice choice;
  std::string origin;
};

std::vector<bool> causal_values(const std::string &text) {
  std::vector<bool> values;
  if (text == "yes" || text == "both")
    values.push_back(true);
  if (text == "no" || text == "both")
    values.push_back(false);
  return values;
}

// Reads `key` as a list of T (a single value counts as a list of one).
template <typename T> bool read_list(const json &object, const char *key, std::vector<T> *out, std::string *error) {
  if (!object.contains(key))
    return true;
  const json &value = object.at(key);
  out->clear();
  try {
    if (value.is_array())
      for (const json &item : value)
        out->push_back(item.get<T>());
    else
      out->push_back(value.get<T>());
  } catch (const json::exception &e) {
    *error = std::string("'") + key + "': " + e.what();
    return false;
  }
  return true;
}

// One shape set from a JSON object; fields left out keep the command line's values.
bool shape_set_from_json(const json &j, const ShapeSet &defaults, ShapeSet *out, std::string *error) {
  static const std::set<std::string> kKnown = {"archs",      "ops",        "dtypes", "head_dims", "causal",
                                               "page_sizes", "gqa_groups", "q_lens", "varlen",    "comment"};
  if (!j.is_object()) {
    *error = "each shape set must be a JSON object";
    return false;
  }
  for (const auto &[key, value] : j.items())
    if (!kKnown.contains(key)) {
      *error = "unknown field '" + key + "' (known: archs, ops, dtypes, head_dims, causal, page_sizes, gqa_groups, " +
               "q_lens, varlen)";
      return false;
    }
  *out = defaults;
  if (!read_list(j, "archs", &out->archs, error) || !read_list(j, "ops", &out->ops, error) ||
      !read_list(j, "dtypes", &out->dtypes, error) || !read_list(j, "page_sizes", &out->page_sizes, error) ||
      !read_list(j, "gqa_groups", &out->gqa_groups, error) || !read_list(j, "q_lens", &out->q_lens, error))
    return false;
  if (j.contains("head_dims")) {
    out->head_dims.clear();
    for (const json &d : j.at("head_dims")) {
      if (d.is_number_integer())
        out->head_dims.emplace_back(d.get<int>(), d.get<int>());
      else if (d.is_array() && d.size() == 2 && d[0].is_number_integer() && d[1].is_number_integer())
        out->head_dims.emplace_back(d[0].get<int>(), d[1].get<int>());
      else {
        *error = "'head_dims': each item is a head dim or a [qk, v] pair, got " + d.dump();
        return false;
      }
    }
  }
  for (const char *key : {"causal", "varlen"}) {
    if (!j.contains(key))
      continue;
    std::vector<bool> &target = std::string(key) == "causal" ? out->causal : out->varlen;
    const json &value = j.at(key);
    if (value.is_string() && value == "both")
      target = {true, false};
    else if (value.is_boolean())
      target = {value.get<bool>()};
    else if (!read_list(j, key, &target, error))
      return false;
  }
  return true;
}

// `backend` is the one the kernels are built with: it decides which alternatives a runtime may pick.
bool expand(const ShapeSet &set, flashjit_backend backend, std::vector<KernelSpec> *specs, std::string *error) {
  for (const std::string &arch_text : set.archs) {
    std::optional<Arch> arch = Arch::parse(arch_text);
    if (!arch) {
      *error = "arch " + arch_text + ": expected sm80, sm86, sm89 or sm90a";
      return false;
    }
    for (const std::string &op : set.ops) {
      if (op != "prefill" && op != "decode" && op != "combine") {
        *error = "op " + op + ": expected prefill, decode or combine";
        return false;
      }
      for (const std::string &dtype : set.dtypes) {
        if (dtype != "bf16" && dtype != "fp16") {
          *error = "dtype " + dtype + ": expected bf16 or fp16";
          return false;
        }
        for (auto [qk, v] : set.head_dims)
          for (bool causal : set.causal)
            for (int page_size : set.page_sizes)
              for (bool varlen : set.varlen) {
                KernelSpec spec;
                spec.arch = *arch;
                spec.dtype = dtype == "fp16" ? FLASHJIT_FP16 : FLASHJIT_BF16;
                spec.head_dim_qk = qk;
                spec.head_dim_v = v;
                spec.causal = causal;
                spec.page_size = page_size;
                spec.varlen = varlen;
                if (op == "prefill") {
                  specs->push_back(spec);
                  // The short-key block a problem may pick at run time (fa3_key_block_for).
                  if (KernelSpec short_keys = spec; (short_keys.key_block = fa3_short_key_block(spec, backend)) != 0)
                    specs->push_back(short_keys);
                  continue;
                }
                if (op == "combine") { // merge_states: only the dtype and head_dim_v change its code
                  KernelSpec combine;
                  combine.op = Op::combine;
                  combine.arch = spec.arch;
                  combine.dtype = spec.dtype;
                  combine.head_dim_qk = combine.head_dim_v = v;
                  specs->push_back(combine);
                  continue;
                }
                if (varlen)
                  continue; // decode problems are batch mode (see spec_for_problem)
                spec.op = Op::decode;
                for (int group : set.gqa_groups)
                  for (int q_len : set.q_lens) {
                    KernelSpec decode = spec;
                    decode.gqa_group = group;
                    decode.q_len = q_len;
                    // The same normalization spec_for_problem applies: one causal row sees every key.
                    decode.causal = causal && q_len > 1;
                    specs->push_back(decode);
                    // The wide key block a short step may pick at run time (decode_key_block_for).
                    if (KernelSpec wide = decode; (wide.key_block = decode_wide_key_block(decode, backend)) != 0)
                      specs->push_back(wide);
                  }
              }
      }
    }
  }
  return true;
}

bool build_specs(const AotOptions &o, flashjit_backend backend, std::vector<KernelSpec> *specs, std::string *error) {
  ShapeSet cli = o.cli;
  cli.head_dims.clear();
  for (size_t i = 0; i < o.head_dims.size(); ++i)
    cli.head_dims.emplace_back(
        o.head_dims[i], o.head_dims_v.empty() ? o.head_dims[i] : o.head_dims_v[std::min(i, o.head_dims_v.size() - 1)]);
  cli.causal = causal_values(o.causal);
  if (o.specs_file.empty())
    return expand(cli, backend, specs, error);
  std::ifstream in(o.specs_file);
  if (!in) {
    *error = "--specs " + o.specs_file + ": cannot read";
    return false;
  }
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (j.is_discarded()) {
    *error = "--specs " + o.specs_file + ": not valid JSON";
    return false;
  }
  // {"shapes": [...]} or [...] or one object.
  const json sets = j.is_object() && j.contains("shapes") ? j.at("shapes") : (j.is_array() ? j : json::array({j}));
  for (const json &set_json : sets) {
    ShapeSet set;
    if (!shape_set_from_json(set_json, cli, &set, error) || !expand(set, backend, specs, error)) {
      *error = "--specs " + o.specs_file + ": " + *error;
      return false;
    }
  }
  return true;
}

bool wants(const AotOptions &o, const char *artifact) {
  return std::find(o.emit.begin(), o.emit.end(), artifact) != o.emit.end();
}

struct SpecLess {
  bool operator()(const KernelSpec &a, const KernelSpec &b) const {
    auto tie = [](const KernelSpec &s) {
      return std::make_tuple(static_cast<int>(s.op), s.arch.sm, s.arch.arch_specific, static_cast<int>(s.dtype),
                             s.head_dim_qk, s.head_dim_v, s.causal, s.local, s.softcap, s.varlen, s.page_size,
                             s.gqa_group, s.q_len, s.align_bytes, s.key_block);
    };
    return tie(a) < tie(b);
  }
};

} // namespace

Action add_aot(CLI::App &app) {
  auto o = std::make_shared<AotOptions>();
  app.add_option("--arch", o->cli.archs, "target archs: sm80, sm86, sm89, sm90a")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--head-dim", o->head_dims, "head dims of Q/K, e.g. 64,80,128")->delimiter(',')->capture_default_str();
  app.add_option("--head-dim-v", o->head_dims_v, "head dims of V, paired with --head-dim (default: the same)")
      ->delimiter(',');
  app.add_option("--dtype", o->cli.dtypes, "bf16, fp16")->delimiter(',')->capture_default_str();
  app.add_option("--causal", o->causal, "yes | no | both")
      ->check(CLI::IsMember({"yes", "no", "both"}))
      ->capture_default_str();
  app.add_option("--op", o->cli.ops, "ops to generate: prefill, decode, combine")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--page-size", o->cli.page_sizes, "paged-KV page sizes (0: contiguous KV)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--gqa-group", o->cli.gqa_groups, "decode: query heads per KV head")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--q-len", o->cli.q_lens, "decode: query tokens per sequence")->delimiter(',')->capture_default_str();
  app.add_option("--specs", o->specs_file,
                 "JSON spec list: {\"shapes\": [{\"archs\", \"ops\", \"dtypes\", \"head_dims\" (d or [qk, v]), "
                 "\"causal\" (true|false|\"both\"), \"page_sizes\", \"gqa_groups\", \"q_lens\", \"varlen\"}]}; fields "
                 "left out take the command line's values");
  app.add_option("--out", o->out_dir, "bundle directory (manifest.json + one .cubin per kernel)")
      ->capture_default_str();
  app.add_option("--bundle", o->bundle_file, "also write a single-file bundle, e.g. model.fjb");
  app.add_option("--emit", o->emit, "artifacts in --out: cubin (the bundle), ptx (for reading)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("-j,--jobs", o->jobs, "parallel compiles (default: cores)")->capture_default_str();
  app.add_flag("--no-cache", o->no_cache, "ignore the disk cache (measure cold compiles)");
  app.add_flag("-q,--quiet", o->quiet, "one progress line instead of a line per kernel");
  app.add_option("--backend", o->backend,
                 "compiler: auto | nvrtc | mlir (mlir: combine, decode, fa2 and fa3 specs its generators cover; "
                 "see README)")
      ->check(CLI::IsMember({"auto", "nvrtc", "mlir"}))
      ->capture_default_str();
  app.add_option("--variant", o->variant, "prefill kernel family: auto (the planner's choice) | fa2 | fa3")
      ->check(CLI::IsMember({"auto", "fa2", "fa3"}))
      ->capture_default_str();
  return [o] {
    Options options;
    options.disk_cache = o->no_cache ? 0 : 1;
    options.backend = o->backend == "mlir"    ? FLASHJIT_BACKEND_MLIR
                      : o->backend == "nvrtc" ? FLASHJIT_BACKEND_NVRTC
                                              : FLASHJIT_BACKEND_AUTO;
    options.variant = o->variant == "fa2"   ? FLASHJIT_VARIANT_FA2
                      : o->variant == "fa3" ? FLASHJIT_VARIANT_FA3
                                            : FLASHJIT_VARIANT_AUTO;
    const StoreConfig config = store_config_from(options);
    std::vector<KernelSpec> specs;
    std::string error;
    if (!build_specs(*o, config.backend, &specs, &error)) {
      std::cerr << "flashjit aot: " << error << "\n";
      return 2;
    }
    KernelStore store(config);
    std::sort(specs.begin(), specs.end(), SpecLess{});
    specs.erase(std::unique(specs.begin(), specs.end()), specs.end());
    std::vector<Job> jobs;
    for (const KernelSpec &spec : specs)
      jobs.push_back(Job{spec});

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
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (o->quiet) {
          std::cout << "\r[" << finished << "/" << jobs.size() << "] " << static_cast<int>(elapsed) << " s"
                    << (finished == jobs.size() ? "\n" : "") << std::flush;
          continue;
        }
        std::cout << "[" << finished << "/" << jobs.size() << "] "
                  << (job.error.empty() ? job.kernel.name : "FAILED " + kernel_name(job.spec, job.choice.plan));
        if (job.error.empty())
          std::cout << " ("
                    << (job.origin == "jit"
                            ? std::to_string(static_cast<int>(job.kernel.compile_seconds * kMillisecondsPerSecond)) +
                                  " ms " + job.kernel.backend
                            : job.origin)
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
    const double compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    BundleContents contents;
    size_t failures = 0, compiled = 0, reused = 0;
    double slowest_cold = 0;
    std::set<std::string> names;
    for (Job &job : jobs) {
      if (!job.error.empty()) {
        ++failures;
        std::cerr << job.error << "\n";
        continue;
      }
      (job.origin == "jit" ? compiled : reused) += 1;
      if (job.origin == "jit")
        slowest_cold = std::max(slowest_cold, job.kernel.compile_seconds);
      const flashjit_backend backend = resolve_backend(store.config().backend, job.choice.plan.variant);
      if (!names.insert(job.kernel.name).second)
        continue; // two specs planned to one kernel (e.g. a decode shape that falls back to prefill)
      if (wants(*o, "ptx") && !job.kernel.ptx.empty()) {
        std::filesystem::create_directories(o->out_dir);
        std::string ptx_error;
        write_file_atomic(std::filesystem::path(o->out_dir) / (job.kernel.name + ".ptx"), job.kernel.ptx, &ptx_error);
      }
      BundleKernel entry =
          bundle_kernel_from(job.choice, cache_key(job.choice.spec, job.choice.plan, backend), job.kernel);
      contents.add(std::move(entry), std::move(job.kernel.cubin));
    }
    uint64_t bytes = 0;
    for (const auto &cubin : contents.cubins)
      bytes += cubin.size();
    const size_t kernels = contents.cubins.size();
    if (wants(*o, "cubin")) {
      if (Status s = write_bundle_directory(o->out_dir, contents); !s) {
        std::cerr << "flashjit aot: " << s.message << "\n";
        return 1;
      }
    }
    if (!o->bundle_file.empty()) {
      if (Status s = write_bundle_file(o->bundle_file, contents); !s) {
        std::cerr << "flashjit aot: " << s.message << "\n";
        return 1;
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << "aot: " << kernels << " kernels (" << compiled << " compiled, " << reused << " reused), "
              << static_cast<uint64_t>(static_cast<double>(bytes) / kBytesPerKiB) << " KiB of cubins in " << o->out_dir
              << (o->bundle_file.empty() ? "" : " and " + o->bundle_file) << ", " << seconds << " s wall ("
              << compile_seconds << " s compiling) with " << o->jobs << " jobs";
    if (slowest_cold > 0)
      std::cout << "; slowest cold compile " << static_cast<int>(slowest_cold * kMillisecondsPerSecond) << " ms";
    std::cout << (failures ? ", " + std::to_string(failures) + " FAILED" : "") << "\n";
    return failures ? 1 : 0;
  };
}

} // namespace flashjit::cli
