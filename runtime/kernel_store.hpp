// The kernel store: memory -> registered bundles -> disk cache -> JIT, then load into a context. One
// job: turning a KernelSpec into a loaded, launchable kernel, exactly once per (spec, context),
// thread-safely. A bundle hit touches no compiler: NVRTC is neither loaded nor asked its version.
#pragma once

#include "compiler/compiled_kernel.hpp"
#include "compiler/planner.hpp"
#include "compiler/plans/fa3_plan.hpp"
#include "runtime/bundle.hpp"
#include "runtime/disk_cache.hpp"
#include "runtime/module.hpp"

#include <flashjit/flashjit.hpp>

#include <atomic>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

namespace flashjit {

struct StoreConfig {
  flashjit_backend backend = FLASHJIT_BACKEND_AUTO;
  bool disk_cache = true;
  bool jit = true;
  bool strict = false;
  std::optional<Variant> variant; // forced kernel family (options.variant / FLASHJIT_VARIANT)
  std::filesystem::path cache_dir;
  std::vector<std::filesystem::path> bundles; // FLASHJIT_BUNDLE_PATH (colon-separated), registered in order
  // FLASHJIT_FA3_TUNING (developer override for A/B runs, compiler/plans/fa3_plan.hpp): the text, and
  // the parsed tuning or why it does not parse (then every kernel request fails, naming it).
  std::string fa3_tuning_text;
  std::optional<Fa3Tuning> fa3_tuning;
  std::string fa3_tuning_error;
  // An options field out of its enum's range (options_error below): every kernel request fails, naming it.
  std::string options_error;
};

// Empty when every enum field of `options` holds one of its values; else which field and what it
// may be. flashjit_runtime_create refuses such options; a C++ Runtime made with them refuses every
// kernel request with this message.
std::string options_error(const flashjit_options &options);

// Settings from flashjit_options plus the environment (FLASHJIT_CACHE, FLASHJIT_CACHE_DIR, FLASHJIT_JIT,
// FLASHJIT_BACKEND, FLASHJIT_STRICT, FLASHJIT_VARIANT, FLASHJIT_BUNDLE_PATH, FLASHJIT_FA3_TUNING). Explicit
// options win over the environment.
StoreConfig store_config_from(const flashjit_options &options);

struct KernelRecord {
  PlanChoice choice;   // spec, plan, preferred variant and fallback reason
  std::string name;    // canonical kernel name
  std::string key;     // cache key (hex)
  std::string origin;  // where the cubin came from: bundle:<path> | disk | jit
  std::string backend; // e.g. "nvrtc 13.0"
  ResourceUsage resources;
  double compile_seconds = 0;
  LoadedKernel kernel;
  LoadedKernel companion; // decode_splitk: fj_decode_combine from the same cubin
};

struct SpecHash {
  size_t operator()(const KernelSpec &spec) const noexcept;
};

class KernelStore {
public:
  explicit KernelStore(StoreConfig config);

  const StoreConfig &config() const { return config_; }
  DiskCache *disk() { return disk_.get(); }

  // The loaded kernel for `spec` in `context` (the current one): memory, else disk, else JIT.
  Status get(const KernelSpec &spec, CUcontext context, std::shared_ptr<const KernelRecord> *out);

  // Compiles (or fetches from the disk cache) without any GPU or driver: AOT and explain.
  Status compile(const KernelSpec &spec, CompiledKernel *out, PlanChoice *choice, std::string *origin);

  // The plan a spec maps to, with strict mode applied.
  Status choose(const KernelSpec &spec, PlanChoice *choice) const;

  // Opens, verifies and registers a bundle; later lookups try it after the ones registered before.
  // A kernel already provided by an earlier bundle stays with that one (logged at info).
  Status register_bundle(const std::filesystem::path &path);
  std::vector<std::shared_ptr<const Bundle>> bundles() const;

  // Whether `spec` is served without compiling (memory, a bundle or the disk cache), and from where.
  Status served(const KernelSpec &spec, bool *served, std::string *origin);

private:
  struct Slot {
    std::mutex mutex;
    std::shared_ptr<const KernelRecord> record;
    // Set (release) once `record` is built; `record` is never written after that, so a hit reads it
    // under the map's shared lock alone.
    std::atomic<bool> built{false};
  };
  struct SlotKey {
    KernelSpec spec;
    CUcontext context;
    bool operator==(const SlotKey &) const = default;
  };
  struct SlotKeyHash {
    size_t operator()(const SlotKey &key) const noexcept;
  };

  struct BundleHit {
    std::shared_ptr<const Bundle> bundle;
    const BundleKernel *kernel = nullptr;
  };
  Status fetch_or_build(const PlanChoice &choice, CompiledKernel *out, std::string *origin, std::string *key);
  std::optional<BundleHit> find_in_bundles(const PlanChoice &choice) const;
  std::string not_in_bundle_message(const PlanChoice &choice) const;

  StoreConfig config_;
  std::unique_ptr<DiskCache> disk_;
  mutable std::shared_mutex bundles_mutex_;
  std::vector<std::shared_ptr<const Bundle>> bundles_;      // registration order
  std::unordered_map<std::string, BundleHit> bundle_index_; // kernel name -> first bundle holding it
  std::shared_mutex slots_mutex_;
  std::unordered_map<SlotKey, std::shared_ptr<Slot>, SlotKeyHash> slots_;
};

} // namespace flashjit
