#include "runtime/driver.hpp"
#include "runtime/launch.hpp"
#include "runtime/log.hpp"
#include "runtime/params.hpp"
#include "runtime/tma_desc.hpp"

#include "params_fa3.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace flashjit {
namespace {

// Encoding four tensor maps costs more than the launch itself, and an engine calls forward with the
// same tensors layer after layer: each thread keeps its last few encoded parameter blocks. An entry
// is reused only when the kernel (its cache key), the device facts and every byte of the attention
// parameters are the same.
struct EncodedParams {
  const KernelRecord *kernel = nullptr;
  std::string kernel_key;
  int sm_count = 0, l2_bytes = 0, total_k = 0, num_pages = 0;
  bool workspace_given = false; // a drawn walk without its counter takes the snake's sections
  fj_attention_params base{};
  fj_fa3_params params{};
  int grid = 0;
  bool dynamic_tiles = false; // kDynamicTiles: the launch attaches the workspace's counter
  bool programmatic = false;  // kProgrammaticLaunch (looked up here, not per launch)
};
constexpr size_t kEncodedCacheEntries = 4;
thread_local std::array<EncodedParams, kEncodedCacheEntries> encoded_cache;
thread_local size_t encoded_cache_next = 0;

bool same_inputs(const EncodedParams &e, const KernelRecord &kernel, const LaunchContext &ctx, int total_k,
                 int num_pages, bool workspace_given, const fj_attention_params &base) {
  return e.kernel == &kernel && e.kernel_key == kernel.key && e.sm_count == ctx.sm_count &&
         e.l2_bytes == ctx.l2_bytes && e.total_k == total_k && e.num_pages == num_pages &&
         e.workspace_given == workspace_given && std::memcmp(&e.base, &base, sizeof(base)) == 0;
}

// Tail split: its counters and partial states live in the caller's workspace (flashjit_workspace_size
// says how much); without one every tile is walked whole, as the plan's kernel does when the tail
// has nothing to even out. Dynamic tiles: their counter lives there; without one the kernel hands
// out the snake's tiles.
Status attach_workspace(const KernelRecord &kernel, const NormalizedProblem &problem, int walkers, bool dynamic,
                        Fa3Launch *out) {
  const Fa3WorkspaceLayout layout = fa3_workspace_layout(kernel.choice.plan, walkers);
  char *workspace = static_cast<char *>(problem.p.workspace);
  if (!workspace) {
    out->params.tail_units = 0;
    out->params.tile_counter = nullptr;
    (dynamic ? out->dynamic_unused : out->tail_unused) = true;
    return Status::success();
  }
  if (reinterpret_cast<uintptr_t>(workspace) % kWorkspaceAlignment != 0)
    return Status::error(FLASHJIT_INVALID_ARGUMENT, "workspace: expected a 256-byte aligned device pointer");
  if (problem.p.workspace_bytes < layout.total_bytes)
    return Status::error(FLASHJIT_INVALID_ARGUMENT,
                         "workspace_bytes = " + std::to_string(problem.p.workspace_bytes) + ": " + kernel.name +
                             " needs " + std::to_string(layout.total_bytes) + " (flashjit_workspace_size)");
  out->counter_bytes = layout.counter_bytes;
  if (dynamic) {
    out->params.tile_counter = reinterpret_cast<fj_i32 *>(workspace);
    return Status::success();
  }
  out->params.tail_counters = reinterpret_cast<fj_i32 *>(workspace);
  out->params.tail_partials = reinterpret_cast<float *>(workspace + layout.partials_offset);
  return Status::success();
}

} // namespace

Status fa3_launch(const KernelRecord &kernel, const NormalizedProblem &problem, const LaunchContext &ctx,
                  Fa3Launch *out) {
  const KernelSpec &spec = kernel.choice.spec;
  const Plan &plan = kernel.choice.plan;
  fj_attention_params base{}; // zero-filled padding, so the byte comparison above is exact
  base = make_attention_params(problem);
  const int total_k = problem.varlen ? problem.p.total_k : problem.p.batch * problem.p.seqlen_k;
  const int num_pages = problem.paged ? problem.p.num_pages : 0;
  const bool workspace_given = problem.p.workspace != nullptr;
  const EncodedParams *hit = nullptr;
  for (const EncodedParams &e : encoded_cache)
    if (same_inputs(e, kernel, ctx, total_k, num_pages, workspace_given, base))
      hit = &e;
  if (!hit) {
    EncodedParams &e = encoded_cache[encoded_cache_next++ % kEncodedCacheEntries];
    e = EncodedParams{};
    e.params.base = base;
    std::string why_not;
    if (!fa3_encode_tensor_maps(spec, plan, total_k, num_pages, driver::api()->cuTensorMapEncodeTiled, &e.params,
                                &why_not)) {
      e.kernel = nullptr;
      return Status::error(FLASHJIT_INVALID_ARGUMENT, kernel.name + ": TMA cannot address this layout: " + why_not);
    }
    // CTA pairs: as many walkers as clusters fit at once (all 66 on the H200); without the answer
    // the grid is sized by the SM count, which is only slower where fewer clusters fit.
    int resident_clusters = 0;
    if (plan.cluster_m > 1)
      if (Status s = kernel.kernel.max_active_clusters(Dim3{static_cast<unsigned>(plan.threads)}, plan.smem_bytes,
                                                       Dim3{static_cast<unsigned>(plan.cluster_m)}, &resident_clusters);
          !s) {
        log(LogLevel::warn,
            kernel.name + ": grid sized by the SM count, the cluster occupancy query failed: " + s.message);
        resident_clusters = 0;
      }
    e.dynamic_tiles = plan.constant("kDynamicTiles", 0) != 0;
    e.programmatic = plan.constant("kProgrammaticLaunch", 0) != 0;
    e.grid = fa3_fill_schedule(spec, plan, ctx.sm_count, ctx.l2_bytes, &e.params, resident_clusters,
                               e.dynamic_tiles && workspace_given);
    e.kernel = &kernel;
    e.kernel_key = kernel.key;
    e.sm_count = ctx.sm_count;
    e.l2_bytes = ctx.l2_bytes;
    e.total_k = total_k;
    e.num_pages = num_pages;
    e.workspace_given = workspace_given;
    e.base = base;
    hit = &e;
  }
  out->params = hit->params; // the launch copies its arguments; the cache entry stays intact
  if (out->params.tail_units > 0 || hit->dynamic_tiles)
    if (Status s = attach_workspace(kernel, problem, hit->grid / std::max(plan.cluster_m, 1), hit->dynamic_tiles, out);
        !s)
      return s;
  out->grid = Dim3{static_cast<unsigned>(hit->grid)};
  out->block = Dim3{static_cast<unsigned>(plan.threads)};
  out->cluster = Dim3{static_cast<unsigned>(plan.cluster_m)};
  out->smem_bytes = plan.smem_bytes;
  out->programmatic = hit->programmatic;
  return Status::success();
}

Status launch_fa3(const KernelRecord &kernel, Fa3Launch &launch, CUstream stream) {
  void *args[] = {&launch.params};
  return kernel.kernel.launch(launch.grid, launch.block, launch.smem_bytes, stream, args, launch.cluster,
                              launch.programmatic);
}

Status launch_fa3(const KernelRecord &kernel, const NormalizedProblem &problem, const LaunchContext &ctx,
                  CUstream stream) {
  Fa3Launch launch;
  if (Status s = fa3_launch(kernel, problem, ctx, &launch); !s)
    return s;
  return launch_fa3(kernel, launch, stream);
}

} // namespace flashjit
