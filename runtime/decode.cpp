#include "runtime/decode.hpp"

#include "runtime/driver.hpp"
#include "runtime/launch.hpp"
#include "runtime/params.hpp"
#include "runtime/tma_desc.hpp"

#include "params_decode.h"

#include <xxhash.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

namespace flashjit {
namespace {

// TMA tiles: encoding K's and V's maps costs ~1 us of host time per launch (run 22's decode step
// against run 19c's, docs/performance.md). A layer's paged pool gives the same maps step after
// step (they do not depend on the lengths), and so does a contiguous cache passed with a fixed
// seqlen_k, so each thread keeps the last kMapCacheEntries encodings, direct-mapped by a hash of
// what they depend on.

// Plain data, zeroed with memset before it is filled (padding included): hashed and compared as bytes.
struct KvMapKey {
  const KernelRecord *kernel;
  fj_tensor_ref k, v;
  fj_i64 page_stride_k, page_stride_v;
  fj_i32 page_size, num_pages, seqlen_k, batch, heads_kv, pad;
};
struct KvMapEntry {
  KvMapKey key{};
  std::string kernel_key; // the record's cache key: a freed record's address may be reused
  fj_tensor_map k_map{}, v_map{};
  bool valid = false;
};
constexpr size_t kMapCacheEntries = 128;
thread_local std::array<KvMapEntry, kMapCacheEntries> kv_map_cache;

KvMapKey kv_map_key(const KernelRecord &kernel, const NormalizedProblem &n, const fj_attention_params &a) {
  KvMapKey key;
  std::memset(&key, 0, sizeof key);
  key.kernel = &kernel;
  key.k = a.k;
  key.v = a.v;
  key.page_stride_k = a.paged.page_stride_k;
  key.page_stride_v = a.paged.page_stride_v;
  key.page_size = a.paged.page_size;
  key.num_pages = n.paged ? n.p.num_pages : 0;
  key.seqlen_k = a.seqlen_k;
  key.batch = a.batch;
  key.heads_kv = a.heads_kv;
  return key;
}

// Fills params->k_map / v_map from the cache or by encoding them (and caching the result).
Status kv_tensor_maps(const KernelRecord &kernel, const NormalizedProblem &n, fj_decode_tma_params *params) {
  const KvMapKey key = kv_map_key(kernel, n, params->base.attn);
  KvMapEntry &entry = kv_map_cache[XXH64(&key, sizeof key, 0) % kMapCacheEntries];
  if (entry.valid && std::memcmp(&entry.key, &key, sizeof key) == 0 && entry.kernel_key == kernel.key) {
    params->k_map = entry.k_map;
    params->v_map = entry.v_map;
    return Status::success();
  }
  std::string why_not;
  if (!decode_encode_tensor_maps(kernel.choice.spec, kernel.choice.plan, key.num_pages,
                                 driver::api()->cuTensorMapEncodeTiled, params, &why_not))
    return Status::error(FLASHJIT_INVALID_ARGUMENT, kernel.name + ": TMA cannot address this layout: " + why_not);
  entry.key = key;
  entry.kernel_key = kernel.key;
  entry.k_map = params->k_map;
  entry.v_map = params->v_map;
  entry.valid = true;
  return Status::success();
}

} // namespace

Status decode_layout(const KernelRecord &kernel, const NormalizedProblem &n, const LaunchContext &ctx,
                     SplitKShape *shape, SplitKLayout *layout) {
  const Plan &plan = kernel.choice.plan;
  SplitKShape s;
  s.num_sms = ctx.sm_count;
  s.ctas_per_sm = static_cast<int>(plan.constant("kCtasPerSm", 1));
  s.block_m = static_cast<int>(plan.constant("kBlockM"));
  s.block_n = static_cast<int>(plan.constant("kBlockN"));
  s.m_blocks = static_cast<int>(plan.constant("kMBlocks"));
  s.head_dim_v = n.p.head_dim_v;
  s.heads_kv = n.p.heads_kv;
  s.max_batch = n.p.batch;
  // Paged TMA tiles load 16-key boxes of one page: pieces start on whole boxes, and a run's extra
  // piece costs such a CTA more (splitk_piece_cost_keys).
  const bool paged_tma = n.paged && plan.constant("kTmaKv", 0) != 0;
  if (paged_tma)
    s.split_granule = static_cast<int>(plan.constant("kTmaBoxRows"));
  s.piece_cost_keys = splitk_piece_cost_keys(n.p.head_dim_qk, n.p.head_dim_v, paged_tma);
  std::string error;
  if (!splitk_layout(s, layout, &error))
    return Status::error(FLASHJIT_INTERNAL, kernel.name + ": workspace layout: " + error);
  *shape = s;
  return Status::success();
}

Status plan_decode_schedule(const KernelRecord &kernel, const NormalizedProblem &n, const LaunchContext &ctx,
                            DecodeSchedule *out) {
  DecodeSchedule d;
  d.spec = kernel.choice.spec;
  d.batch = n.p.batch;
  if (Status s = decode_layout(kernel, n, ctx, &d.shape, &d.layout); !s)
    return s;
  if (!n.p.workspace)
    return Status::error(FLASHJIT_INVALID_ARGUMENT, "workspace: null; allocate flashjit_workspace_size bytes");
  if (reinterpret_cast<uintptr_t>(n.p.workspace) % kWorkspaceAlignment != 0)
    return Status::error(FLASHJIT_INVALID_ARGUMENT, "workspace: expected a 256-byte aligned device pointer");
  if (n.p.workspace_bytes < d.layout.total_bytes)
    return Status::error(FLASHJIT_INVALID_ARGUMENT, "workspace_bytes = " + std::to_string(n.p.workspace_bytes) +
                                                        ": this problem needs " + std::to_string(d.layout.total_bytes) +
                                                        " (flashjit_workspace_size)");
  if (n.paged && !n.p.seqlens_k_host)
    return Status::error(FLASHJIT_INVALID_ARGUMENT,
                         "seqlens_k_host: null; planning a paged decode needs the host copy of the KV lengths");
  SplitKProblem problem;
  problem.seqlens_k = n.paged ? n.p.seqlens_k_host : nullptr;
  problem.seqlen_k = n.p.seqlen_k;
  problem.batch = n.p.batch;
  problem.q_len = n.p.seqlen_q;
  problem.window_left = n.p.window_left;
  problem.m_blocks = d.shape.m_blocks;
  std::vector<char> host(d.layout.int_bytes);
  std::string error;
  if (!splitk_schedule(d.shape, d.layout, problem, host.data(), host.size(), &d.schedule, &error))
    return Status::error(FLASHJIT_INVALID_ARGUMENT, kernel.name + ": schedule: " + error);
  CUdeviceptr base = reinterpret_cast<CUdeviceptr>(n.p.workspace);
  if (CUresult r = driver::api()->cuMemcpyHtoD(base, host.data(), host.size()); r != CUDA_SUCCESS)
    return driver::driver_error("copying the decode schedule into the workspace", r);
  d.fused_merge = kernel.choice.plan.constant("kFusedMerge", 0) != 0;
  d.combine_threads = static_cast<unsigned>(kernel.choice.plan.constant("kCombineThreads"));
  d.tma_kv = kernel.choice.plan.constant("kTmaKv", 0) != 0;
  *out = d;
  return Status::success();
}

Status launch_decode(const KernelRecord &kernel, const NormalizedProblem &n, const DecodeSchedule &d, CUstream stream) {
  const Plan &plan = kernel.choice.plan;
  char *workspace = static_cast<char *>(n.p.workspace);
  fj_decode_params params{};
  params.attn = make_attention_params(n);
  params.attn.maybe_partial_o = reinterpret_cast<float *>(workspace + d.layout.partial_o_offset);
  params.attn.maybe_partial_lse = reinterpret_cast<float *>(workspace + d.layout.partial_lse_offset);
  params.header = reinterpret_cast<const fj_decode_header *>(workspace + d.layout.header_offset);
  params.slot_begin = reinterpret_cast<const fj_i32 *>(workspace + d.layout.slot_offset);
  params.work = reinterpret_cast<const fj_decode_work *>(workspace + d.layout.work_offset);
  params.merges = reinterpret_cast<const fj_decode_merge *>(workspace + d.layout.merge_offset);
  params.m_blocks = d.shape.m_blocks;
  void *args[] = {&params};
  // TMA tiles: the K/V maps follow the parameters. The combine takes fj_decode_params alone.
  fj_decode_tma_params tma_params;
  if (d.tma_kv) {
    tma_params.base = params;
    if (Status s = kv_tensor_maps(kernel, n, &tma_params); !s)
      return s;
    args[0] = &tma_params;
  }
  const Dim3 grid{static_cast<unsigned>(d.layout.grid)};
  // sm_90: the kernels go out with PDL. The decode reads only its work list before
  // griddepcontrol.wait, so its launch overlaps the previous kernel of the stream; the merge waits
  // for the decode's partial states the same way.
  const bool pdl = kernel.choice.spec.arch.sm >= 90;
  if (Status s = kernel.kernel.launch(grid, Dim3{static_cast<unsigned>(plan.threads)}, plan.smem_bytes, stream, args,
                                      Dim3{}, pdl);
      !s)
    return s;
  // kFusedMerge: the decode grid merges its split units itself (the last CTA to finish one of a
  // unit's pieces), so a step is this one launch. With PDL the previous kernel of the stream is
  // then typically the previous step's decode, which wrote the same partial states, O and merge
  // counters: the decode's griddepcontrol.wait comes before its first access to any of them, and
  // waits for that grid to complete with its writes visible (its merging CTAs have put every
  // counter back to zero by then).
  if (d.fused_merge)
    return Status::success();
  // Launched even when this schedule split nothing (it then exits at once): a captured graph stays
  // valid when the workspace is planned again for lengths that do split.
  void *combine_args[] = {&params};
  return kernel.companion.launch(grid, Dim3{d.combine_threads}, 0, stream, combine_args, Dim3{}, pdl);
}

} // namespace flashjit
