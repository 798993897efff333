// flashjit::Runtime: validate -> spec -> kernel store (memory, disk, JIT) -> launch.
#include "compiler/build.hpp"
#include "compiler/plans/decode_plan.hpp"
#include "runtime/decode.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_store.hpp"
#include "runtime/launch.hpp"
#include "runtime/log.hpp"
#include "runtime/problem.hpp"
#include "runtime/tma_desc.hpp"
#include "runtime/workspace_ledger.hpp"

#include <flashjit/flashjit.hpp>

#include <algorithm>
#include <atomic>
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
      return Status::error(FLASHJIT_DRIVER_ERROR, "no current CUDA context on this thread: make one current first "
                                                  "(cudaSetDevice + any runtime call, or cuCtxSetCurrent)");
    const driver::DeviceInfo *device = nullptr;
    if (Status s = driver::context_device(*context, &device); !s)
      return s;
    *arch = Arch::from_compute_capability(device->cc_major, device->cc_minor);
    launch->sm_count = device->sm_count;
    launch->l2_bytes = device->l2_bytes;
    return Status::success();
  }

  // The spec a problem runs: decode-shaped problems need a workspace for split-K; without one they
  // run the prefill kernel, and that fallback is logged (once) and refused in strict mode.
  Status runnable_spec(const NormalizedProblem &n, const Arch &arch, KernelSpec *spec) {
    *spec = spec_for_problem(n, arch, store.config().backend);
    if (spec->op != Op::decode || n.p.workspace)
      return Status::success();
    static constexpr const char *kReason =
        "decode_splitk needs problem.workspace and flashjit_plan; the prefill kernel runs this decode problem";
    if (store.config().strict)
      return Status::error(FLASHJIT_FALLBACK_FORBIDDEN, std::string("strict mode: ") + kReason);
    if (!decode_fallback_logged.exchange(true))
      log(LogLevel::info, std::string("fallback: ") + kReason);
    spec->op = Op::prefill;
    spec->gqa_group = 0;
    spec->q_len = 0;
    spec->key_block = 0; // decode's wide block is no prefill key block: the planner's tiles
    return Status::success();
  }

  Status resolve(const AttentionProblem &problem, NormalizedProblem *normalized,
                 std::shared_ptr<const KernelRecord> *record, LaunchContext *launch) {
    if (!store.config().options_error.empty())
      return Status::error(FLASHJIT_INVALID_ARGUMENT, store.config().options_error);
    if (Status s = validate_problem(&problem, normalized); !s)
      return s;
    CUcontext context = nullptr;
    Arch arch;
    if (Status s = current_target(&context, &arch, launch); !s)
      return s;
    KernelSpec spec;
    if (Status s = runnable_spec(*normalized, arch, &spec); !s)
      return s;
    return store.get(spec, context, record);
  }

  // The fa3 tail split's arrival counters (or the dynamic tiles' counter), at the workspace's start,
  // must be zero when its kernel starts; each launch leaves them so. Zeroed (on `stream`) the first
  // time a workspace carries them, or whatever the ledger knew when `rezero` (flashjit_plan: the
  // memory may be new or written since). *zeroed says whether a memset was issued.
  Status zero_workspace_counters(const Fa3Launch &launch, const void *workspace, CUstream stream, bool rezero,
                                 bool *zeroed) {
    *zeroed = false;
    if (launch.counter_bytes == 0 || workspaces.tail_counters_zero(workspace, launch.counter_bytes, rezero))
      return Status::success();
    if (CUresult r = driver::api()->cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(workspace), 0,
                                                     launch.counter_bytes / sizeof(fj_i32), stream);
        r != CUDA_SUCCESS) {
      workspaces.forget(workspace);
      return driver::driver_error("zeroing the fa3 kernel's workspace counters", r);
    }
    *zeroed = true;
    return Status::success();
  }

  // Without a workspace the planned tail split is off and every tile is walked whole (logged once).
  Status forward_fa3(const KernelRecord &record, const NormalizedProblem &problem, const LaunchContext &context,
                     CUstream stream) {
    Fa3Launch launch;
    if (Status s = fa3_launch(record, problem, context, &launch); !s)
      return s;
    bool zeroed = false;
    if (Status s = zero_workspace_counters(launch, problem.p.workspace, stream, false, &zeroed); !s)
      return s;
    if (launch.tail_unused && !tail_without_workspace_logged.exchange(true))
      log(LogLevel::info, record.name + ": no workspace, so the last waves run whole tiles instead of the tail "
                                        "split (flashjit_workspace_size says how much it needs)");
    if (launch.dynamic_unused && !dynamic_without_workspace_logged.exchange(true))
      log(LogLevel::info, record.name + ": no workspace, so the tiles are walked in the snake's fixed order instead "
                                        "of drawn from a counter (flashjit_workspace_size says how much it needs)");
    return launch_fa3(record, launch, stream);
  }

  KernelStore store;
  std::atomic<bool> decode_fallback_logged{false};
  std::atomic<bool> tail_without_workspace_logged{false};
  std::atomic<bool> dynamic_without_workspace_logged{false};
  WorkspaceLedger workspaces; // decode schedules and tail counters, by workspace pointer
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
  const CUstream cu_stream = reinterpret_cast<CUstream>(stream);
  switch (record->choice.plan.variant) {
  case Variant::fa2: return launch_fa2(*record, normalized, launch, cu_stream);
  case Variant::fa3: return impl_->forward_fa3(*record, normalized, launch, cu_stream);
  case Variant::decode_splitk: break;
  case Variant::combine:
    return Status::error(FLASHJIT_INTERNAL, record->name + ": a merge kernel is launched by merge_states");
  }
  const std::optional<DecodeSchedule> schedule = impl_->workspaces.schedule(normalized.p.workspace);
  if (!schedule)
    return Status::error(FLASHJIT_INVALID_ARGUMENT,
                         "workspace: no decode plan for this workspace (or a prefill's "
                         "tail split used it since); call flashjit_plan (Runtime::plan) first");
  if (!(schedule->spec == record->choice.spec) || schedule->batch != normalized.p.batch)
    return Status::error(FLASHJIT_INVALID_ARGUMENT,
                         "workspace: planned for another problem (" + kernel_name(schedule->spec, record->choice.plan) +
                             ", batch " + std::to_string(schedule->batch) + "); call flashjit_plan again");
  return launch_decode(*record, normalized, *schedule, cu_stream);
}

Status Runtime::workspace_size(const AttentionProblem &problem, size_t *bytes) {
  NormalizedProblem normalized;
  std::shared_ptr<const KernelRecord> record;
  LaunchContext launch;
  AttentionProblem with_workspace = problem;
  with_workspace.workspace = reinterpret_cast<void *>(uintptr_t{256}); // asks for the split-K kernel
  if (Status s = impl_->resolve(with_workspace, &normalized, &record, &launch); !s)
    return s;
  *bytes = 0;
  if (record->choice.plan.variant == Variant::fa3) {
    // The tail split's counters and partial states, or the dynamic tiles' counter (none without
    // kTailSplit or kDynamicTiles), for as many walkers as the grid can have.
    *bytes = fa3_workspace_layout(record->choice.plan, launch.sm_count / std::max(record->choice.plan.cluster_m, 1))
                 .total_bytes;
    return Status::success();
  }
  if (record->choice.plan.variant != Variant::decode_splitk)
    return Status::success(); // fa2 needs no workspace
  SplitKShape shape;
  SplitKLayout layout;
  if (Status s = decode_layout(*record, normalized, launch, &shape, &layout); !s)
    return s;
  *bytes = layout.total_bytes;
  return Status::success();
}

Status merge_states_impl(KernelStore &store, const flashjit_merge_problem &problem, flashjit_stream stream);

Status Runtime::merge_states(const flashjit_merge_problem &problem, flashjit_stream stream) {
  return merge_states_impl(impl_->store, problem, stream);
}

Status Runtime::plan(const AttentionProblem &problem) {
  NormalizedProblem normalized;
  std::shared_ptr<const KernelRecord> record;
  LaunchContext launch;
  if (Status s = impl_->resolve(problem, &normalized, &record, &launch); !s)
    return s;
  if (record->choice.plan.variant == Variant::fa3) {
    // The tail split's (or the dynamic tiles') counters, zeroed here for every forward that follows
    // on this workspace.
    Fa3Launch fa3;
    if (Status s = fa3_launch(*record, normalized, launch, &fa3); !s)
      return s;
    bool zeroed = false;
    if (Status s = impl_->zero_workspace_counters(fa3, problem.workspace, nullptr, true, &zeroed); !s)
      return s;
    if (CUresult r = zeroed ? driver::api()->cuStreamSynchronize(nullptr) : CUDA_SUCCESS; r != CUDA_SUCCESS)
      return driver::driver_error("cuStreamSynchronize after zeroing the fa3 kernel's workspace counters", r);
    return Status::success();
  }
  if (record->choice.plan.variant != Variant::decode_splitk)
    return Status::success(); // nothing to schedule
  DecodeSchedule schedule;
  if (Status s = plan_decode_schedule(*record, normalized, launch, &schedule); !s)
    return s;
  impl_->workspaces.set_schedule(problem.workspace, schedule);
  return Status::success();
}

Status Runtime::register_bundle(const std::string &path) {
  return impl_->store.register_bundle(path);
}

Status Runtime::read_kernel_global(const AttentionProblem &problem, const std::string &symbol,
                                   std::vector<unsigned char> *out) {
  NormalizedProblem normalized;
  std::shared_ptr<const KernelRecord> record;
  LaunchContext launch;
  if (Status s = impl_->resolve(problem, &normalized, &record, &launch); !s)
    return s;
  if (normalized.empty || !record)
    return Status::error(FLASHJIT_INVALID_ARGUMENT, "problem: an empty problem runs no kernel");
  const driver::Api *api = driver::api();
  CUdeviceptr address = 0;
  size_t size = 0;
  if (api->cuModuleGetGlobal(&address, &size, record->kernel.module(), symbol.c_str()) != CUDA_SUCCESS)
    return Status::error(FLASHJIT_INVALID_ARGUMENT, "symbol '" + symbol + "': " + record->name + " has no such global");
  if (CUresult r = api->cuCtxSynchronize(); r != CUDA_SUCCESS)
    return driver::driver_error("cuCtxSynchronize before reading " + symbol, r);
  out->resize(size);
  if (CUresult r = api->cuMemcpyDtoH(out->data(), address, size); r != CUDA_SUCCESS)
    return driver::driver_error("reading " + symbol, r);
  return Status::success();
}

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
  if (Status s = impl_->store.served(spec_for_problem(normalized, arch, impl_->store.config().backend), &found, &where);
      !s)
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
  KernelSpec spec;
  Status runnable = impl_->runnable_spec(normalized, arch, &spec);
  const KernelSpec problem_spec = spec_for_problem(normalized, arch, impl_->store.config().backend);
  if (!runnable)
    spec = problem_spec;
  const bool decode_without_workspace = problem_spec.op == Op::decode && spec.op != Op::decode;
  Explanation e;
  PlanChoice choice;
  Status chosen = impl_->store.choose(spec, &choice);
  if (!chosen && chosen.code != FLASHJIT_FALLBACK_FORBIDDEN)
    return chosen;
  e.kernel = kernel_name(choice.spec, choice.plan);
  e.variant = variant_name(choice.plan.variant);
  e.preferred_variant = variant_name(choice.preferred);
  e.fallback_reason = choice.fallback_reason;
  e.preference_reason = choice.preference_reason;
  if (decode_without_workspace) {
    e.preferred_variant = variant_name(Variant::decode_splitk);
    e.fallback_reason = "no workspace: decode_splitk needs problem.workspace and flashjit_plan";
    e.preference_reason.clear(); // the prefill's choice among its variants, not the decode's
  }
  std::ostringstream plan;
  plan << "block " << choice.plan.block_m << "x" << choice.plan.block_n << ", stages " << choice.plan.stages
       << ", threads " << choice.plan.threads << ", smem " << choice.plan.smem_bytes << " B";
  if (choice.plan.consumer_warpgroups)
    plan << ", consumer warpgroups " << choice.plan.consumer_warpgroups << (choice.plan.pingpong ? " (pingpong)" : "");
  if (choice.plan.persistent)
    plan << ", persistent grid";
  if (choice.plan.cluster_m > 1)
    plan << ", CTA clusters of " << choice.plan.cluster_m << " (K/V multicast)";
  if (choice.plan.constant("kTailSplit", 0) != 0)
    plan << ", last waves split by keys"
         << (problem.workspace ? " (where that shortens the longest walk by 8 blocks and 2%)" : " (off: no workspace)");
  if (choice.plan.constant("kUnmaskedKeyLoop", 0) != 0)
    plan << ", a key loop without mask code (only the last key block can hold keys past seqlen_k)";
  if (choice.plan.constant("kLazyRescale", 0) != 0)
    plan << (choice.plan.constant("kLazyTopRounding", 0) != 0
                 ? ", lazy O rescale with its top rounding (a row's max moves only by more than 2^8; O is normalized "
                   "by the P that weighted V)"
                 : ", lazy O rescale (a row's max moves only by more than 2^8; rounding error up to about the naive "
                   "reference's, where eager rescaling stays below it)");
  if (choice.plan.variant == Variant::fa3 && choice.spec.page_size != 0) {
    if (choice.plan.constant("kPagedGather", 0) != 0)
      plan << ", K/V gathered through the block table by the producer warpgroup's cp.async, 16 bytes a copy ("
           << choice.spec.page_size << "-key pages: no TMA box tiles them; rows past a sequence's end land as zeros)"
           << (choice.plan.constant("kGatherNoincArrive", 0) != 0
                   ? ", each thread's copies arriving on the block's barrier as they land (cp.async.mbarrier.arrive)"
                   : "");
    else
      plan << ", K/V through the block table in TMA boxes of " << choice.plan.constant("kPagedBoxRows", 0)
           << " keys (V rows past a sequence's end zeroed before PV)";
  }
  const flashjit_backend backend = resolve_backend(impl_->store.config().backend, choice.plan.variant);
  if (choice.plan.variant == Variant::fa3 && choice.spec.key_block != 0) {
    KernelSpec default_spec = choice.spec;
    default_spec.key_block = 0;
    Plan default_plan;
    const bool planned = plan_fa3(default_spec, &default_plan, nullptr, backend);
    const bool same_block = planned && default_plan.block_n == choice.spec.key_block;
    const bool fewer_warpgroups = planned && default_plan.consumer_warpgroups != choice.plan.consumer_warpgroups;
    plan << (choice.spec.causal && fewer_warpgroups
                 ? ", the short causal tile (a short sequence: two warpgroups, O in its own region)"
             : choice.spec.causal ? ", the short causal key block (a short sequence: narrower key blocks)"
             : same_block ? ", the short-sequence tile (too few key blocks to split the last waves: no tail split)"
                          : ", the short key block (it pads this key length less)");
  }
  if (choice.plan.variant == Variant::decode_splitk) {
    const std::string_view no_tma = tma_kv_unsupported(choice.spec, backend, choice.plan.block_n);
    plan << ", " << choice.plan.constant("kCtasPerSm", 0) << " CTAs per SM";
    if (choice.spec.key_block != 0)
      plan << ", the wide key block (a short step: 128-key tiles"
           << (choice.plan.constant("kCtasPerSm", 0) == 1 ? ", one CTA per SM, so half the partial states to merge)"
                                                          : ")");
    plan << ", K/V tiles by "
         << (choice.plan.constant("kTmaKv", 0) != 0 ? "TMA"
             : no_tma.empty()                       ? "cp.async"
                                                    : "cp.async (no TMA: " + std::string(no_tma) + ")");
  }
  e.plan = plan.str();
  e.backend = backend_name(backend);
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
  else if (!e.preference_reason.empty())
    text << " (preferred: " << e.preference_reason << ")";
  else
    text << " (preferred)";
  text << "\nplan:     " << e.plan << "\nbackend:  " << e.backend << "\norigin:   " << e.origin;
  if (e.registers >= 0)
    text << "\nptxas:    " << e.registers << " registers, " << e.spill_bytes << " spill bytes";
  if (!chosen)
    text << "\nstrict:   " << chosen.message;
  if (!runnable)
    text << "\nstrict:   " << runnable.message;
  if (!target_note.empty())
    text << "\nnote:     " << target_note;
  text << "\n";
  e.text = text.str();
  *out = std::move(e);
  return Status::success();
}

} // namespace flashjit
