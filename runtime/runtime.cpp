// flashjit::Runtime: validate -> spec -> kernel store (memory, disk, JIT) -> launch.
#include "compiler/build.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_store.hpp"
#include "runtime/launch.hpp"
#include "runtime/problem.hpp"

#include <flashjit/flashjit.hpp>

#include <sstream>

namespace flashjit {

struct Runtime::Impl {
  explicit Impl(const Options &options) : store(store_config_from(options)) {}

  // The current context, its device's arch and SM count. No context is an error: flashjit launches
  // where the caller works and never makes a context current behind its back.
  Status current_target(CUcontext *context, Arch *arch, LaunchContext *launch) {
    std::string error;
    const driver::Api *api = driver::api(&error);
    if (!api)
      return Status::error(FLASHJIT_DRIVER_ERROR, error);
    CUresult r = api->cuCtxGetCurrent(context);
    if (r != CUDA_SUCCESS)
      return driver::driver_error("cuCtxGetCurrent", r);
    if (!*context)
      return Status::error(FLASHJIT_DRIVER_ERROR,
                           "no current CUDA context on this thread: make one current first "
                           "(cudaSetDevice + any runtime call, or cuCtxSetCurrent)");
    driver::DeviceInfo device;
    if (Status s = driver::current_device(&device); !s)
      return s;
    *arch = Arch::from_compute_capability(device.cc_major, device.cc_minor);
    launch->sm_count = device.sm_count;
    launch->l2_bytes = device.l2_bytes;
    return Status::success();
  }

  Status resolve(const AttentionProblem &problem, NormalizedProblem *normalized,
                 std::shared_ptr<const KernelRecord> *record, LaunchContext *launch) {
    if (Status s = validate_problem(&problem, normalized); !s)
      return s;
    CUcontext context = nullptr;
    Arch arch;
    if (Status s = current_target(&context, &arch, launch); !s)
      return s;
    return store.get(spec_for_problem(*normalized, arch), context, record);
  }

  KernelStore store;
};

Runtime::Runtime(const Options &options) : impl_(std::make_unique<Impl>(options)) {}
Runtime::~Runtime() = default;

Status Runtime::prepare(const AttentionProblem &problem) {
  NormalizedProblem normalized;
  std::shared_ptr<const KernelRecord> record;
  LaunchContext launch;
  return impl_->resolve(problem, &normalized, &record, &launch);
}

Status Runtime::forward(const AttentionProblem &problem, flashjit_stream stream) {
  NormalizedProblem normalized;
  std::shared_ptr<const KernelRecord> record;
  LaunchContext launch;
  if (Status s = impl_->resolve(problem, &normalized, &record, &launch); !s)
    return s;
  if (normalized.empty)
    return Status::success();
  return launch_variant(*record, normalized, launch, reinterpret_cast<CUstream>(stream));
}

Status Runtime::register_bundle(const std::string &path) { return impl_->store.register_bundle(path); }

Status Runtime::is_served(const AttentionProblem &problem, const std::string &arch_text, bool *served,
                          std::string *origin) {
  // An engine asks at start-up, before it has tensors: stand-in pointers are 16-byte aligned.
  constexpr uintptr_t kStandInAddress = 256;
  AttentionProblem shape = problem;
  for (const void **ptr : {&shape.q, &shape.k, &shape.v})
    if (!*ptr)
      *ptr = reinterpret_cast<const void *>(kStandInAddress);
  if (!shape.o)
    shape.o = reinterpret_cast<void *>(kStandInAddress);
  NormalizedProblem normalized;
  if (Status s = validate_problem(&shape, &normalized); !s)
    return s;
  Arch arch;
  if (arch_text.empty()) {
    CUcontext context = nullptr;
    LaunchContext launch;
    if (Status s = impl_->current_target(&context, &arch, &launch); !s)
      return Status::error(s.code, "is_served without an arch needs the current device: " + s.message);
  } else if (std::optional<Arch> parsed = Arch::parse(arch_text)) {
    arch = *parsed;
  } else {
    return Status::error(FLASHJIT_INVALID_ARGUMENT, "arch '" + arch_text + "': expected sm80, sm86, sm89 or sm90a");
  }
  std::string where;
  bool found = false;
  if (Status s = impl_->store.served(spec_for_problem(normalized, arch), &found, &where); !s)
    return s;
  *served = found;
  if (origin)
    *origin = where;
  return Status::success();
}

Status Runtime::explain(const AttentionProblem &problem, Explanation *out) {
  NormalizedProblem normalized;
  if (Status s = validate_problem(&problem, &normalized); !s)
    return s;
  CUcontext context = nullptr;
  Arch arch;
  LaunchContext launch;
  std::string target_note;
  if (Status s = impl_->current_target(&context, &arch, &launch); !s) {
    arch = Arch{90, true};
    target_note = "no GPU context (" + s.message + "); explained for sm90a";
  }
  const KernelSpec spec = spec_for_problem(normalized, arch);
  Explanation e;
  PlanChoice choice;
  Status chosen = impl_->store.choose(spec, &choice);
  if (!chosen && chosen.code != FLASHJIT_FALLBACK_FORBIDDEN)
    return chosen;
  e.kernel = kernel_name(choice.spec, choice.plan);
  e.variant = variant_name(choice.plan.variant);
  e.preferred_variant = variant_name(choice.preferred);
  e.fallback_reason = choice.fallback_reason;
  std::ostringstream plan;
  plan << "block " << choice.plan.block_m << "x" << choice.plan.block_n << ", stages " << choice.plan.stages
       << ", threads " << choice.plan.threads << ", smem " << choice.plan.smem_bytes << " B";
  if (choice.plan.consumer_warpgroups)
    plan << ", consumer warpgroups " << choice.plan.consumer_warpgroups << (choice.plan.pingpong ? " (pingpong)" : "");
  if (choice.plan.persistent)
    plan << ", persistent grid";
  e.plan = plan.str();
  e.backend = backend_name(resolve_backend(impl_->store.config().backend, choice.plan.variant));
  e.origin = "not loaded";
  if (context) {
    std::shared_ptr<const KernelRecord> record;
    if (Status s = impl_->store.get(spec, context, &record); s) {
      e.origin = record->origin;
      e.backend = record->backend;
      e.registers = record->resources.registers;
      e.spill_bytes = record->resources.spill_store_bytes;
      e.shared_bytes = choice.plan.smem_bytes;
    }
  }
  std::ostringstream text;
  text << "kernel:   " << e.kernel << "\n"
       << "variant:  " << e.variant;
  if (!e.fallback_reason.empty())
    text << " (fallback from " << e.preferred_variant << ": " << e.fallback_reason << ")";
  else
    text << " (preferred)";
  text << "\nplan:     " << e.plan << "\nbackend:  " << e.backend << "\norigin:   " << e.origin;
  if (e.registers >= 0)
    text << "\nptxas:    " << e.registers << " registers, " << e.spill_bytes << " spill bytes";
  if (!chosen)
    text << "\nstrict:   " << chosen.message;
  if (!target_note.empty())
    text << "\nnote:     " << target_note;
  text << "\n";
  e.text = text.str();
  *out = std::move(e);
  return Status::success();
}

} // namespace flashjit
