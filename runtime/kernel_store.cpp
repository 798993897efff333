#include "runtime/kernel_store.hpp"

#include "compiler/build.hpp"
#include "runtime/log.hpp"

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>

namespace flashjit {
namespace {

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
  kernel->name = meta.value("name", "");
  kernel->entry = meta.value("entry", "");
  kernel->backend = meta.value("backend", "");
  kernel->resources.registers = meta.value("registers", -1);
  kernel->resources.spill_store_bytes = meta.value("spill_store_bytes", -1);
  kernel->resources.spill_load_bytes = meta.value("spill_load_bytes", -1);
  kernel->resources.static_smem_bytes = meta.value("static_smem_bytes", -1);
  kernel->compile_seconds = meta.value("compile_seconds", 0.0);
  return !kernel->entry.empty();
}

} // namespace

StoreConfig store_config_from(const flashjit_options &options) {
  StoreConfig config;
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
  return config;
}

size_t SpecHash::operator()(const KernelSpec &s) const noexcept {
  const int fields[] = {static_cast<int>(s.op), s.arch.sm, s.arch.arch_specific, static_cast<int>(s.dtype),
                        s.head_dim_qk, s.head_dim_v, s.causal, s.local, s.softcap, s.varlen, s.page_size,
                        s.gqa_group, s.q_len, s.align_bytes};
  return XXH64(fields, sizeof(fields), 0);
}

size_t KernelStore::SlotKeyHash::operator()(const SlotKey &key) const noexcept {
  return SpecHash{}(key.spec) ^ (std::hash<const void *>{}(key.context) * 0x9e3779b97f4a7c15ull);
}

KernelStore::KernelStore(StoreConfig config) : config_(std::move(config)) {
  if (config_.disk_cache)
    disk_ = std::make_unique<DiskCache>(config_.cache_dir);
}

Status KernelStore::choose(const KernelSpec &spec, PlanChoice *choice) const {
  *choice = choose_plan(spec, config_.variant);
  if (!choice->ok)
    return Status::error(FLASHJIT_UNSUPPORTED, choice->error);
  if (!choice->fallback_reason.empty() && config_.strict)
    return Status::error(FLASHJIT_FALLBACK_FORBIDDEN,
                         "strict mode: the preferred kernel " + std::string(variant_name(choice->preferred)) +
                             " cannot run (" + choice->fallback_reason + "); fallback to " +
                             variant_name(choice->plan.variant) + " refused");
  return Status::success();
}

Status KernelStore::fetch_or_build(const PlanChoice &choice, CompiledKernel *out, std::string *origin) {
  const flashjit_backend backend = resolve_backend(config_.backend, choice.plan.variant);
  const std::string key = cache_key(choice.spec, choice.plan, backend);
  const std::string name = kernel_name(choice.spec, choice.plan);
  if (disk_ && disk_->usable()) {
    if (std::optional<CacheEntry> entry = disk_->load(key, name)) {
      CompiledKernel kernel;
      if (read_metadata(entry->metadata, &kernel)) {
        kernel.cubin = std::move(entry->cubin);
        *out = std::move(kernel);
        *origin = "disk";
        return Status::success();
      }
      log(LogLevel::warn, "disk cache entry for " + name + " has unreadable metadata; recompiling");
    }
  }
  if (!config_.jit)
    return Status::error(FLASHJIT_NOT_IN_BUNDLE, "JIT is off (FLASHJIT_JIT=off) and no cache holds " + name);
  CompiledKernel kernel;
  if (Status s = build_kernel(choice.spec, choice.plan, backend, &kernel); !s)
    return s;
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
  return fetch_or_build(*choice, out, origin);
}

Status KernelStore::get(const KernelSpec &spec, CUcontext context, std::shared_ptr<const KernelRecord> *out) {
  const SlotKey slot_key{spec, context};
  std::shared_ptr<Slot> slot;
  {
    std::shared_lock lock(slots_mutex_);
    auto it = slots_.find(slot_key);
    if (it != slots_.end())
      slot = it->second;
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
  if (Status s = fetch_or_build(record->choice, &compiled, &record->origin); !s)
    return s;
  const Plan &plan = record->choice.plan;
  if (Status s = LoadedKernel::load(compiled.cubin, plan.entry, plan.smem_bytes, &record->kernel); !s)
    return Status::error(s.code, kernel_name(record->choice.spec, plan) + ": " + s.message);
  record->name = kernel_name(record->choice.spec, plan);
  record->key = cache_key(record->choice.spec, plan, resolve_backend(config_.backend, plan.variant));
  record->backend = compiled.backend;
  record->resources = compiled.resources;
  record->compile_seconds = compiled.compile_seconds;
  if (!record->choice.fallback_reason.empty())
    log(LogLevel::info, "fallback: " + record->name + " runs instead of " +
                            variant_name(record->choice.preferred) + " because " + record->choice.fallback_reason);
  slot->record = record;
  *out = record;
  return Status::success();
}

} // namespace flashjit
