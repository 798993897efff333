#include "runtime/kernel_store.hpp"

#include "compiler/build.hpp"
#include "runtime/json_fields.hpp"
#include "runtime/log.hpp"

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace flashjit {
namespace {

constexpr const char *kDecodeCombineEntry = "fj_decode_combine";

std::string env(const char *name) {
  const char *value = std::getenv(name);
  return value ? value : "";
}

bool env_off(const char *name) {
  const std::string v = env(name);
  return v == "off" || v == "0" || v == "false" || v == "no";
}

bool env_on(const char *name) {
  const std::string v = env(name);
  return v == "on" || v == "1" || v == "true" || v == "yes";
}

std::string metadata_json(const CompiledKernel &kernel) {
  nlohmann::json meta = {
      {"name", kernel.name},
      {"entry", kernel.entry},
      {"backend", kernel.backend},
      {"registers", kernel.resources.registers},
      {"spill_store_bytes", kernel.resources.spill_store_bytes},
      {"spill_load_bytes", kernel.resources.spill_load_bytes},
      {"static_smem_bytes", kernel.resources.static_smem_bytes},
      {"compile_seconds", kernel.compile_seconds},
  };
  return meta.dump();
}

bool read_metadata(const std::string &text, CompiledKernel *kernel) {
  nlohmann::json meta = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object())
    return false;
  JsonFields fields; // a field of another type makes the entry a miss, as a corrupt one
  kernel->name = fields.get(meta, "name", "");
  kernel->entry = fields.get(meta, "entry", "");
  kernel->backend = fields.get(meta, "backend", "");
  kernel->resources.registers = fields.get(meta, "registers", -1);
  kernel->resources.spill_store_bytes = fields.get(meta, "spill_store_bytes", -1);
  kernel->resources.spill_load_bytes = fields.get(meta, "spill_load_bytes", -1);
  kernel->resources.static_smem_bytes = fields.get(meta, "static_smem_bytes", -1);
  kernel->compile_seconds = fields.get(meta, "compile_seconds", 0.0);
  return fields.ok() && !kernel->entry.empty();
}

// How far a bundled kernel is from the one asked for, for "closest kernels" answers: a different
// op, arch or dtype is far (it can never stand in), a different flag less so, head dims by distance.
constexpr int kFarMismatch = 10000;
constexpr int kDtypeMismatch = 1000;
constexpr int kFlagMismatch = 100;
constexpr size_t kClosestShown = 3;

int spec_distance(const KernelSpec &want, const KernelSpec &have) {
  int d = 0;
  d += want.op != have.op ? kFarMismatch : 0;
  d += want.arch != have.arch ? kFarMismatch : 0;
  d += want.dtype != have.dtype ? kDtypeMismatch : 0;
  for (bool differs :
       {want.causal != have.causal, want.local != have.local, want.softcap != have.softcap, want.varlen != have.varlen,
        want.page_size != have.page_size, want.gqa_group != have.gqa_group, want.q_len != have.q_len,
        want.align_bytes != have.align_bytes, want.key_block != have.key_block})
    d += differs ? kFlagMismatch : 0;
  d += std::abs(want.head_dim_qk - have.head_dim_qk) + std::abs(want.head_dim_v - have.head_dim_v);
  return d;
}

std::vector<std::filesystem::path> split_paths(const std::string &text) {
  std::vector<std::filesystem::path> paths;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ':'))
    if (!item.empty())
      paths.emplace_back(item);
  return paths;
}

// FLASHJIT_DUMP_DIR: the generated source and the PTX of every kernel this process compiles.
void dump_artifacts(const std::string &name, const CompiledKernel &kernel) {
  const std::string dir = env("FLASHJIT_DUMP_DIR");
  if (dir.empty())
    return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  for (const auto &[suffix, text] : {std::pair<const char *, const std::string *>{".cu", &kernel.source},
                                     {".ptx", &kernel.ptx},
                                     {".log", &kernel.log}}) {
    if (text->empty())
      continue;
    std::ofstream out(std::filesystem::path(dir) / (name + suffix), std::ios::trunc);
    out << *text;
  }
  log(LogLevel::info, "dumped " + name + " source and PTX to " + dir);
}

} // namespace

std::string options_error(const flashjit_options &options) {
  switch (options.backend) {
  case FLASHJIT_BACKEND_AUTO:
  case FLASHJIT_BACKEND_NVRTC:
  case FLASHJIT_BACKEND_MLIR: break;
  default:
    return "options.backend = " + std::to_string(static_cast<int>(options.backend)) +
           ": expected FLASHJIT_BACKEND_AUTO, FLASHJIT_BACKEND_NVRTC or FLASHJIT_BACKEND_MLIR";
  }
  switch (options.variant) {
  case FLASHJIT_VARIANT_AUTO:
  case FLASHJIT_VARIANT_FA2:
  case FLASHJIT_VARIANT_FA3:
  case FLASHJIT_VARIANT_DECODE_SPLITK: break;
  default:
    return "options.variant = " + std::to_string(static_cast<int>(options.variant)) +
           ": expected FLASHJIT_VARIANT_AUTO, _FA2, _FA3 or _DECODE_SPLITK";
  }
  return {};
}

StoreConfig store_config_from(const flashjit_options &options) {
  StoreConfig config;
  config.options_error = options_error(options);
  config.backend = options.backend;
  if (options.backend == FLASHJIT_BACKEND_AUTO) {
    const std::string backend = env("FLASHJIT_BACKEND");
    if (backend == "nvrtc")
      config.backend = FLASHJIT_BACKEND_NVRTC;
    else if (backend == "mlir")
      config.backend = FLASHJIT_BACKEND_MLIR;
  }
  config.disk_cache = options.disk_cache != 0 && !env_off("FLASHJIT_CACHE");
  config.jit = options.jit != 0 && !env_off("FLASHJIT_JIT");
  config.strict = options.strict != 0 || env_on("FLASHJIT_STRICT");
  switch (options.variant) {
  case FLASHJIT_VARIANT_FA2: config.variant = Variant::fa2; break;
  case FLASHJIT_VARIANT_FA3: config.variant = Variant::fa3; break;
  case FLASHJIT_VARIANT_DECODE_SPLITK: config.variant = Variant::decode_splitk; break;
  case FLASHJIT_VARIANT_AUTO: {
    const std::string variant = env("FLASHJIT_VARIANT");
    if (variant == "fa2")
      config.variant = Variant::fa2;
    else if (variant == "fa3")
      config.variant = Variant::fa3;
    else if (variant == "decode_splitk")
      config.variant = Variant::decode_splitk;
    break;
  }
  }
  config.cache_dir = options.cache_dir ? std::filesystem::path(options.cache_dir) : DiskCache::default_root();
  config.bundles = split_paths(env("FLASHJIT_BUNDLE_PATH"));
  config.fa3_tuning_text = env("FLASHJIT_FA3_TUNING");
  if (!config.fa3_tuning_text.empty()) {
    Fa3Tuning tuning;
    if (parse_fa3_tuning(config.fa3_tuning_text, &tuning, &config.fa3_tuning_error))
      config.fa3_tuning = tuning;
  }
  return config;
}

size_t SpecHash::operator()(const KernelSpec &s) const noexcept {
  const int fields[] = {static_cast<int>(s.op),
                        s.arch.sm,
                        s.arch.arch_specific,
                        static_cast<int>(s.dtype),
                        s.head_dim_qk,
                        s.head_dim_v,
                        s.causal,
                        s.local,
                        s.softcap,
                        s.varlen,
                        s.page_size,
                        s.gqa_group,
                        s.q_len,
                        s.align_bytes,
                        s.key_block};
  return XXH64(fields, sizeof(fields), 0);
}

size_t KernelStore::SlotKeyHash::operator()(const SlotKey &key) const noexcept {
  return SpecHash{}(key.spec) ^ (std::hash<const void *>{}(key.context) * 0x9e3779b97f4a7c15ull);
}

KernelStore::KernelStore(StoreConfig config) : config_(std::move(config)) {
  if (config_.disk_cache)
    disk_ = std::make_unique<DiskCache>(config_.cache_dir);
  // A bad bundle on FLASHJIT_BUNDLE_PATH must not stop the program: it is refused with a warning
  // and, with JIT off, every kernel it would have held becomes a NOT_IN_BUNDLE error naming it.
  for (const std::filesystem::path &path : config_.bundles)
    if (Status s = register_bundle(path); !s)
      log(LogLevel::warn, "FLASHJIT_BUNDLE_PATH: " + s.message);
  // The override changes which kernels run: say so whenever a store takes it.
  if (config_.fa3_tuning)
    log(LogLevel::warn, "FLASHJIT_FA3_TUNING=" + config_.fa3_tuning_text +
                            ": fa3 plans use this tuning instead of the planner's measured defaults");
  else if (!config_.fa3_tuning_error.empty())
    log(LogLevel::warn, "FLASHJIT_FA3_TUNING=" + config_.fa3_tuning_text + " does not parse (" +
                            config_.fa3_tuning_error + "): every kernel request fails until it is fixed or unset");
  if (!config_.options_error.empty())
    log(LogLevel::warn, config_.options_error + ": every kernel request fails");
}

Status KernelStore::register_bundle(const std::filesystem::path &path) {
  std::shared_ptr<const Bundle> bundle;
  if (Status s = Bundle::open(path, std::nullopt, &bundle); !s)
    return s;
  std::unique_lock lock(bundles_mutex_);
  size_t added = 0;
  for (const BundleKernel &kernel : bundle->manifest().kernels) {
    auto [it, inserted] = bundle_index_.try_emplace(kernel.name, BundleHit{bundle, &kernel});
    if (inserted) {
      ++added;
      continue;
    }
    log(LogLevel::info, "bundle: " + kernel.name + " is in both " + it->second.bundle->path().string() + " and " +
                            path.string() + "; using " + it->second.bundle->path().string() + " (registered first)");
  }
  bundles_.push_back(bundle);
  log(LogLevel::info, "bundle: registered " + path.string() + " (" + std::to_string(bundle->manifest().kernels.size()) +
                          " kernels, " + std::to_string(added) + " new)");
  return Status::success();
}

std::vector<std::shared_ptr<const Bundle>> KernelStore::bundles() const {
  std::shared_lock lock(bundles_mutex_);
  return bundles_;
}

std::optional<KernelStore::BundleHit> KernelStore::find_in_bundles(const PlanChoice &choice) const {
  const std::string name = kernel_name(choice.spec, choice.plan);
  std::shared_lock lock(bundles_mutex_);
  auto it = bundle_index_.find(name);
  if (it == bundle_index_.end())
    return std::nullopt;
  // Same name, other plan constants: the planner changed since the bundle was built. Its cubin
  // would disagree with the launcher about the plan, so it is not used.
  if (it->second.kernel->plan_hash != hex64(kernel_hash(choice.spec, choice.plan))) {
    log(LogLevel::warn, "bundle " + it->second.bundle->path().string() + " holds " + name +
                            " built from a different plan (a stale bundle); not using it");
    return std::nullopt;
  }
  return it->second;
}

std::string KernelStore::not_in_bundle_message(const PlanChoice &choice) const {
  const std::string name = kernel_name(choice.spec, choice.plan);
  std::vector<std::pair<int, std::string>> candidates;
  size_t bundle_count = 0;
  {
    std::shared_lock lock(bundles_mutex_);
    bundle_count = bundles_.size();
    for (const auto &[kernel_name, hit] : bundle_index_)
      candidates.emplace_back(spec_distance(choice.spec, hit.kernel->spec), kernel_name);
  }
  std::sort(candidates.begin(), candidates.end());
  std::string message = "JIT is off (FLASHJIT_JIT=off or options.jit = 0) and no registered bundle (" +
                        std::to_string(bundle_count) + " registered) or cache holds " + name;
  if (candidates.empty()) {
    message += "; the bundles hold no kernels (register one with flashjit_register_bundle or FLASHJIT_BUNDLE_PATH)";
  } else {
    message += "; closest bundled kernels:";
    for (size_t i = 0; i < std::min(kClosestShown, candidates.size()); ++i)
      message += (i ? ", " : " ") + candidates[i].second;
  }
  return message + ". Add this shape to the bundle's spec list (flashjit aot --specs) or turn JIT on.";
}

Status KernelStore::choose(const KernelSpec &spec, PlanChoice *choice) const {
  if (!config_.options_error.empty())
    return Status::error(FLASHJIT_INVALID_ARGUMENT, config_.options_error);
  if (!config_.fa3_tuning_error.empty())
    return Status::error(FLASHJIT_INVALID_ARGUMENT,
                         "FLASHJIT_FA3_TUNING=" + config_.fa3_tuning_text + ": " + config_.fa3_tuning_error);
  *choice = choose_plan(spec, config_.variant, config_.backend, config_.fa3_tuning ? &*config_.fa3_tuning : nullptr);
  if (!choice->ok)
    return Status::error(FLASHJIT_UNSUPPORTED, choice->error);
  if (!choice->fallback_reason.empty() && config_.strict)
    return Status::error(FLASHJIT_FALLBACK_FORBIDDEN,
                         "strict mode: the preferred kernel " + std::string(variant_name(choice->preferred)) +
                             " cannot run (" + choice->fallback_reason + "); fallback to " +
                             variant_name(choice->plan.variant) + " refused");
  return Status::success();
}

Status KernelStore::fetch_or_build(const PlanChoice &choice, CompiledKernel *out, std::string *origin,
                                   std::string *key_out) {
  const std::string name = kernel_name(choice.spec, choice.plan);
  // Bundles first, and before the cache key: the key asks NVRTC its version, which loads NVRTC.
  if (std::optional<BundleHit> hit = find_in_bundles(choice)) {
    const BundleKernel &k = *hit->kernel;
    const std::span<const char> cubin = hit->bundle->cubin(k);
    CompiledKernel kernel;
    kernel.name = k.name;
    kernel.entry = k.entry;
    kernel.backend = k.backend;
    kernel.resources = k.resources;
    kernel.cubin.assign(cubin.begin(), cubin.end());
    *out = std::move(kernel);
    *origin = "bundle:" + hit->bundle->path().string();
    *key_out = k.key;
    return Status::success();
  }
  const flashjit_backend backend = resolve_backend(config_.backend, choice.plan.variant);
  const std::string key = cache_key(choice.spec, choice.plan, backend);
  *key_out = key;
  if (disk_ && disk_->usable()) {
    if (std::optional<CacheEntry> entry = disk_->load(key, name)) {
      CompiledKernel kernel;
      if (read_metadata(entry->metadata, &kernel)) {
        kernel.cubin = std::move(entry->cubin);
        *out = std::move(kernel);
        *origin = "disk";
        log(LogLevel::debug, "disk cache hit: " + name + " (" + key + ")");
        return Status::success();
      }
      log(LogLevel::warn, "disk cache entry for " + name + " has unreadable metadata; recompiling");
    }
  }
  if (!config_.jit)
    return Status::error(FLASHJIT_NOT_IN_BUNDLE, not_in_bundle_message(choice));
  // A JIT compile takes a noticeable fraction of a second: say so before, so it never looks like a hang.
  log(LogLevel::info,
      "compiling " + name + " with " + backend_name(backend) + " (cache miss " + key + "; typically 0.2-1 s)");
  CompiledKernel kernel;
  const Status built = build_kernel(choice.spec, choice.plan, backend, &kernel);
  dump_artifacts(name, kernel);
  if (!built)
    return built;
  log(LogLevel::info, "compiled " + name + " with " + kernel.backend + " in " +
                          std::to_string(static_cast<int>(kernel.compile_seconds * 1000)) + " ms (" +
                          std::to_string(kernel.resources.registers) + " registers, " +
                          std::to_string(kernel.resources.spill_store_bytes) + " spill bytes)");
  if (disk_ && disk_->usable())
    disk_->store(key, name, CacheEntry{kernel.cubin, metadata_json(kernel)});
  *out = std::move(kernel);
  *origin = "jit";
  return Status::success();
}

Status KernelStore::compile(const KernelSpec &spec, CompiledKernel *out, PlanChoice *choice, std::string *origin) {
  if (Status s = choose(spec, choice); !s)
    return s;
  std::string key;
  return fetch_or_build(*choice, out, origin, &key);
}

Status KernelStore::served(const KernelSpec &spec, bool *served, std::string *origin) {
  *served = false;
  PlanChoice choice;
  if (Status s = choose(spec, &choice); !s)
    return s;
  {
    std::shared_lock lock(slots_mutex_);
    for (const auto &[slot_key, slot] : slots_) {
      if (!(slot_key.spec == spec))
        continue;
      // A slot being built right now is not served yet; waiting for its compile would defeat the query.
      std::unique_lock slot_lock(slot->mutex, std::try_to_lock);
      if (slot_lock.owns_lock() && slot->record) {
        *served = true;
        *origin = "memory";
        return Status::success();
      }
    }
  }
  if (std::optional<BundleHit> hit = find_in_bundles(choice)) {
    *served = true;
    *origin = "bundle:" + hit->bundle->path().string();
    return Status::success();
  }
  if (disk_ && disk_->usable()) {
    const std::string name = kernel_name(choice.spec, choice.plan);
    const std::string key = cache_key(choice.spec, choice.plan, resolve_backend(config_.backend, choice.plan.variant));
    if (disk_->load(key, name)) {
      *served = true;
      *origin = "disk";
      return Status::success();
    }
  }
  *origin = config_.jit ? "jit (not pre-generated)" : not_in_bundle_message(choice);
  return Status::success();
}

Status KernelStore::get(const KernelSpec &spec, CUcontext context, std::shared_ptr<const KernelRecord> *out) {
  const SlotKey slot_key{spec, context};
  std::shared_ptr<Slot> slot;
  {
    std::shared_lock lock(slots_mutex_);
    auto it = slots_.find(slot_key);
    if (it != slots_.end()) {
      if (it->second->built.load(std::memory_order_acquire)) { // the hot path: no slot copy, no slot lock
        *out = it->second->record;
        return Status::success();
      }
      slot = it->second;
    }
  }
  if (!slot) {
    std::unique_lock lock(slots_mutex_);
    auto [it, inserted] = slots_.try_emplace(slot_key, std::make_shared<Slot>());
    slot = it->second;
  }
  std::lock_guard slot_lock(slot->mutex); // one thread builds; the others wait for its record
  if (slot->record) {
    *out = slot->record;
    return Status::success();
  }
  auto record = std::make_shared<KernelRecord>();
  if (Status s = choose(spec, &record->choice); !s)
    return s;
  CompiledKernel compiled;
  if (Status s = fetch_or_build(record->choice, &compiled, &record->origin, &record->key); !s)
    return s;
  const Plan &plan = record->choice.plan;
  if (Status s = LoadedKernel::load(compiled.cubin, plan.entry, plan.smem_bytes, &record->kernel); !s)
    return Status::error(s.code, kernel_name(record->choice.spec, plan) + ": " + s.message);
  // The split-K decode module also holds its merge kernel, launched right after it.
  if (plan.variant == Variant::decode_splitk)
    if (Status s = LoadedKernel::load(compiled.cubin, kDecodeCombineEntry, 0, &record->companion); !s)
      return s;
  record->name = kernel_name(record->choice.spec, plan);
  record->backend = compiled.backend;
  record->resources = compiled.resources;
  record->compile_seconds = compiled.compile_seconds;
  if (!record->choice.fallback_reason.empty())
    log(LogLevel::info, "fallback: " + record->name + " runs instead of " + variant_name(record->choice.preferred) +
                            " because " + record->choice.fallback_reason);
  else if (!record->choice.preference_reason.empty())
    log(LogLevel::info, "choice: " + record->name + " (" + variant_name(record->choice.preferred) +
                            " preferred: " + record->choice.preference_reason + ")");
  slot->record = record;
  slot->built.store(true, std::memory_order_release);
  *out = record;
  return Status::success();
}

} // namespace flashjit
