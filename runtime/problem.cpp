#include "runtime/problem.hpp"

#include "compiler/planner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>

namespace flashjit {
namespace {

constexpr int kElementBytes = 2;
constexpr int kVectorBytes = 16;
constexpr int kHeadDimGranule = 8;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxPageSize = 512;
constexpr int64_t kMaxTensorElements = kMaxTensorBytes / kElementBytes;

Status invalid(const std::string &message) {
  return Status::error(FLASHJIT_INVALID_ARGUMENT, message);
}

bool aligned(const void *ptr, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

Status check_head_dim(const char *name, int value) {
  if (value < kHeadDimGranule || value > kMaxHeadDim || value % kHeadDimGranule != 0)
    return invalid(std::string(name) + " = " + std::to_string(value) + ": expected a multiple of 8 from 8 to 256");
  return Status::success();
}

// One strided dimension of an operand: its stride (elements), how many indices it has, and what an
// index of it is called in messages.
struct StridedDim {
  const char *field; // "head", "token", "batch"
  const char *items; // "heads", "tokens", "sequences" (or "pages")
  int64_t stride;
  int64_t count;
};

// Fills zero strides with the contiguous layout and checks that no two (batch, token, head) rows of
// `dim` elements overlap. The dimensions may nest in any order (token-major [B, S, H, D], head-major
// [B, H, S, D], sequence-minor [S, B, H, D], ...): ordered by stride, each must step past everything
// the smaller ones span. `batches` is the number of batch (or page) indices, 1 where there is none.
Status resolve_strides(const char *name, flashjit_strides *s, int rows_per_batch, int heads, int dim, int batches,
                       const char *batch_items = "sequences") {
  auto too_large = [&] {
    return invalid(std::string(name) + ": the tensor (" + std::to_string(batches) + " " + batch_items + " x " +
                   std::to_string(rows_per_batch) + " tokens x " + std::to_string(heads) + " heads x " +
                   std::to_string(dim) + " with strides batch " + std::to_string(s->batch) + ", token " +
                   std::to_string(s->token) + ", head " + std::to_string(s->head) + ") spans more than " +
                   std::to_string(kMaxTensorBytes) + " bytes; expected a tensor that fits in device memory");
  };
  if (s->batch == 0 && s->token == 0 && s->head == 0) {
    // The contiguous layout nests by construction: only its size needs checking (the per-call path).
    s->head = dim;
    s->token = static_cast<int64_t>(heads) * dim; // below 2^39: int32 heads, dim <= 256
    if (__builtin_mul_overflow(static_cast<int64_t>(rows_per_batch), s->token, &s->batch) ||
        !fits_in_device_memory(batches, s->batch, s->batch, kElementBytes))
      return too_large();
    return Status::success();
  }
  if (s->head < 0 || s->token < 0 || s->batch < 0)
    return invalid(std::string(name) + ": strides must be non-negative (elements), got batch " +
                   std::to_string(s->batch) + ", token " + std::to_string(s->token) + ", head " +
                   std::to_string(s->head));
  // Ordered by stride, ties kept in this order (an insertion sort: three items, and no allocation on
  // the per-call path, unlike std::stable_sort's buffer).
  StridedDim dims[] = {{"head", "heads", s->head, heads},
                       {"token", "tokens", s->token, rows_per_batch},
                       {"batch", batch_items, s->batch, batches}};
  for (size_t i = 1; i < std::size(dims); ++i)
    for (size_t j = i; j > 0 && dims[j].stride < dims[j - 1].stride; --j)
      std::swap(dims[j], dims[j - 1]);
  int64_t span = dim; // elements the dimensions checked so far reach, from one row's start
  for (size_t i = 0; i < std::size(dims); ++i) {
    const StridedDim &d = dims[i];
    if (d.count <= 1)
      continue;
    if (d.stride < span) {
      std::string inside = "head_dim"; // what the smaller dimensions span, for the message
      for (size_t k = 0; k < i; ++k)
        if (dims[k].count > 1)
          inside += std::string(" x ") + dims[k].items;
      return invalid(std::string(name) + "." + d.field + " = " + std::to_string(d.stride) + ": " + d.items +
                     " would overlap; expected >= " + std::to_string(span) + " (the extent of " + inside +
                     " inside it), or strides that nest in another order");
    }
    int64_t reach = 0;
    if (__builtin_mul_overflow(d.count - 1, d.stride, &reach) || __builtin_add_overflow(span, reach, &span) ||
        span > kMaxTensorElements)
      return too_large();
  }
  return Status::success();
}

bool strides_vector_aligned(const flashjit_strides &s) {
  const int64_t granule = kVectorBytes / kElementBytes;
  return s.batch % granule == 0 && s.token % granule == 0 && s.head % granule == 0;
}

Status check_cu_seqlens(const char *name, const int32_t *host, int batch, int total, int max_len) {
  if (!host)
    return Status::success();
  if (host[0] != 0)
    return invalid(std::string(name) + "[0] = " + std::to_string(host[0]) + ": expected 0");
  for (int b = 0; b < batch; ++b) {
    const int64_t len = int64_t{host[b + 1]} - host[b];
    if (len < 0)
      return invalid(std::string(name) + " is not monotone at " + std::to_string(b + 1) + " (" +
                     std::to_string(host[b]) + " then " + std::to_string(host[b + 1]) + ")");
    if (len > max_len)
      return invalid(std::string(name) + ": sequence " + std::to_string(b) + " has length " + std::to_string(len) +
                     ", more than the declared maximum " + std::to_string(max_len));
  }
  if (host[batch] != total)
    return invalid(std::string(name) + "[batch] = " + std::to_string(host[batch]) + ": expected the total " +
                   std::to_string(total));
  return Status::success();
}

} // namespace

bool fits_in_device_memory(int64_t count, int64_t stride, int64_t block, int element_bytes) {
  int64_t reach = 0, bytes = 0;
  return !__builtin_mul_overflow(count - 1, stride, &reach) && !__builtin_add_overflow(reach, block, &reach) &&
         !__builtin_mul_overflow(reach, int64_t{element_bytes}, &bytes) && bytes <= kMaxTensorBytes;
}

Status validate_problem(const flashjit_problem *problem, NormalizedProblem *out) {
  if (!problem)
    return invalid("problem: null pointer");
  if (problem->struct_size < sizeof(flashjit_problem))
    return invalid("problem.struct_size = " + std::to_string(problem->struct_size) + ": expected " +
                   std::to_string(sizeof(flashjit_problem)) + " (initialise with flashjit_problem_init)");
  // Normalized in place, one copy of the problem's bytes (every forward comes through here; a
  // local copy handed back at the end cost two more passes). Every other field of *out is set below
  // on the way to success.
  NormalizedProblem &n = *out;
  n.p = *problem;
  flashjit_problem &p = n.p;
  if (p.dtype != FLASHJIT_FP16 && p.dtype != FLASHJIT_BF16)
    return invalid("dtype = " + std::to_string(static_cast<int>(p.dtype)) +
                   ": expected FLASHJIT_FP16 or FLASHJIT_BF16");
  if (p.batch < 1)
    return invalid("batch = " + std::to_string(p.batch) + ": expected >= 1");
  if (p.seqlen_q < 0 || p.seqlen_k < 0)
    return invalid("seqlen_q/seqlen_k = " + std::to_string(p.seqlen_q) + "/" + std::to_string(p.seqlen_k) +
                   ": expected >= 0");
  if (p.heads_q < 1 || p.heads_kv < 1)
    return invalid("heads_q/heads_kv = " + std::to_string(p.heads_q) + "/" + std::to_string(p.heads_kv) +
                   ": expected >= 1");
  if (p.heads_q % p.heads_kv != 0)
    return invalid("heads_q = " + std::to_string(p.heads_q) +
                   " is not a multiple of heads_kv = " + std::to_string(p.heads_kv) + " (GQA/MQA needs whole groups)");
  n.group = p.heads_q / p.heads_kv;
  if (p.head_dim_v == 0)
    p.head_dim_v = p.head_dim_qk;
  if (Status s = check_head_dim("head_dim_qk", p.head_dim_qk); !s)
    return s;
  if (Status s = check_head_dim("head_dim_v", p.head_dim_v); !s)
    return s;
  for (auto [name, ptr] : {std::pair<const char *, const void *>{"q", p.q}, {"k", p.k}, {"v", p.v}, {"o", p.o}}) {
    if (!ptr)
      return invalid(std::string(name) + ": null pointer");
    if (!aligned(ptr, kElementBytes))
      return invalid(std::string(name) + ": pointer not aligned to its 2-byte element");
  }
  if (p.lse && !aligned(p.lse, sizeof(float)))
    return invalid("lse: pointer not aligned to 4 bytes (float32)");
  if (!std::isfinite(p.softcap) || p.softcap < 0)
    return invalid("softcap = " + std::to_string(p.softcap) + ": expected >= 0 (0 = off)");
  if (!std::isfinite(p.scale) || p.scale < 0)
    return invalid("scale = " + std::to_string(p.scale) + ": expected > 0, or 0 for 1/sqrt(head_dim_qk)");
  if (p.scale == 0)
    p.scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim_qk));
  if (p.window_left < -1 || p.window_right < -1)
    return invalid("window_left/window_right = " + std::to_string(p.window_left) + "/" +
                   std::to_string(p.window_right) + ": expected >= 0, or -1 for unbounded");
  if (p.flags != 0)
    return invalid("flags: reserved, expected 0");

  // Varlen
  n.varlen = p.cu_seqlens_q != nullptr;
  n.paged = p.block_table != nullptr;
  // Paged KV takes its lengths from seqlens_k, so varlen paged problems need only cu_seqlens_q.
  if (!n.paged && (p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr))
    return invalid("cu_seqlens_q/cu_seqlens_k: give both (varlen) or neither");
  if (n.paged && !n.varlen && p.cu_seqlens_k)
    return invalid("cu_seqlens_k: not used with paged KV (lengths come from seqlens_k); expected null");
  if (n.varlen) {
    if (!aligned(p.cu_seqlens_q, sizeof(int32_t)) || !aligned(p.cu_seqlens_k, sizeof(int32_t)))
      return invalid("cu_seqlens_q/k: pointers not aligned to int32");
    if (p.total_q < 0 || p.total_k < 0)
      return invalid("total_q/total_k: expected >= 0 (rows of the packed Q and K)");
    if (Status s = check_cu_seqlens("cu_seqlens_q", p.cu_seqlens_q_host, p.batch, p.total_q, p.seqlen_q); !s)
      return s;
    if (!n.paged)
      if (Status s = check_cu_seqlens("cu_seqlens_k", p.cu_seqlens_k_host, p.batch, p.total_k, p.seqlen_k); !s)
        return s;
  }

  // Paged KV
  if (n.paged) {
    if (!aligned(p.block_table, sizeof(int32_t)))
      return invalid("block_table: pointer not aligned to int32");
    if (p.page_size < 1 || p.page_size > kMaxPageSize)
      return invalid("page_size = " + std::to_string(p.page_size) + ": expected 1 to " + std::to_string(kMaxPageSize));
    if (p.max_pages_per_seq < 1)
      return invalid("max_pages_per_seq = " + std::to_string(p.max_pages_per_seq) + ": expected >= 1");
    if (p.num_pages < 1)
      return invalid("num_pages = " + std::to_string(p.num_pages) + ": expected >= 1");
    if (!p.seqlens_k)
      return invalid("seqlens_k: null; paged KV needs the per-sequence KV lengths (device int32 [batch])");
    const int64_t capacity = static_cast<int64_t>(p.max_pages_per_seq) * p.page_size;
    if (p.seqlen_k > capacity)
      return invalid("seqlen_k = " + std::to_string(p.seqlen_k) + " exceeds what the block table covers (" +
                     std::to_string(p.max_pages_per_seq) + " pages x " + std::to_string(p.page_size) + ")");
    if (p.seqlens_k_host) {
      for (int b = 0; b < p.batch; ++b) {
        const int len = p.seqlens_k_host[b];
        if (len < 0 || len > capacity || len > p.seqlen_k)
          return invalid("seqlens_k[" + std::to_string(b) + "] = " + std::to_string(len) + ": expected 0.." +
                         std::to_string(std::min<int64_t>(capacity, p.seqlen_k)) + " (block table covers " +
                         std::to_string(capacity) + ", seqlen_k is the maximum)");
      }
    }
    if (p.block_table_host) {
      for (int b = 0; b < p.batch; ++b) {
        const int64_t len = p.seqlens_k_host ? p.seqlens_k_host[b] : p.seqlen_k;
        const int64_t used_pages = (len + p.page_size - 1) / p.page_size;
        for (int64_t i = 0; i < used_pages; ++i) {
          const int page = p.block_table_host[static_cast<int64_t>(b) * p.max_pages_per_seq + i];
          if (page < 0 || page >= p.num_pages)
            return invalid("block_table[" + std::to_string(b) + "][" + std::to_string(i) + "] = " +
                           std::to_string(page) + ": expected a page index in 0.." + std::to_string(p.num_pages - 1));
        }
      }
    }
  }

  // Strides (elements). Varlen tensors have no batch stride; paged K/V use it between pages.
  const int q_rows = n.varlen ? p.total_q : p.seqlen_q;
  const int k_rows = n.paged ? p.page_size : (n.varlen ? p.total_k : p.seqlen_k);
  const int q_batches = n.varlen ? 1 : p.batch;
  const int kv_batches = n.paged ? p.num_pages : q_batches;
  const char *kv_batch_items = n.paged ? "pages" : "sequences";
  if (Status s = resolve_strides("q_strides", &p.q_strides, q_rows, p.heads_q, p.head_dim_qk, q_batches); !s)
    return s;
  if (Status s =
          resolve_strides("k_strides", &p.k_strides, k_rows, p.heads_kv, p.head_dim_qk, kv_batches, kv_batch_items);
      !s)
    return s;
  if (Status s =
          resolve_strides("v_strides", &p.v_strides, k_rows, p.heads_kv, p.head_dim_v, kv_batches, kv_batch_items);
      !s)
    return s;
  if (Status s = resolve_strides("o_strides", &p.o_strides, q_rows, p.heads_q, p.head_dim_v, q_batches); !s)
    return s;

  bool vector_aligned = true;
  for (const void *ptr : {p.q, p.k, p.v, static_cast<const void *>(p.o)})
    vector_aligned = vector_aligned && aligned(ptr, kVectorBytes);
  for (const flashjit_strides *s : {&p.q_strides, &p.k_strides, &p.v_strides, &p.o_strides})
    vector_aligned = vector_aligned && strides_vector_aligned(*s);
  n.align_bytes = vector_aligned ? kVectorBytes : kElementBytes;
  n.empty = (n.varlen ? p.total_q : p.seqlen_q) == 0;
  return Status::success();
}

KernelSpec spec_for_problem(const NormalizedProblem &n, const Arch &arch, flashjit_backend backend) {
  const flashjit_problem &p = n.p;
  KernelSpec spec;
  spec.arch = arch;
  spec.dtype = p.dtype;
  spec.head_dim_qk = p.head_dim_qk;
  spec.head_dim_v = p.head_dim_v;
  spec.causal = p.causal != 0;
  spec.local = p.window_left >= 0 || p.window_right >= 0;
  spec.softcap = p.softcap > 0;
  spec.varlen = n.varlen;
  spec.page_size = n.paged ? p.page_size : 0;
  spec.align_bytes = n.align_bytes;
  const bool decode_shaped = !n.varlen && p.seqlen_q >= 1 && p.seqlen_q <= kMaxDecodeQueryLength;
  if (decode_shaped) {
    spec.op = Op::decode;
    spec.gqa_group = n.group;
    spec.q_len = p.seqlen_q;
  }
  // A causal mask over a single query row that sees every key is no mask at all.
  if (spec.causal && spec.op == Op::decode && spec.q_len == 1)
    spec.causal = false;
  if (spec.op == Op::prefill && !n.varlen)
    spec.key_block = fa3_key_block_for(spec, p.seqlen_q, p.seqlen_k, backend);
  if (spec.op == Op::decode) {
    // The problem's static shape, not the lengths of the step: a graph captured with one kernel
    // stays right when flashjit_plan sees the next step's lengths.
    const int64_t keys = n.paged ? int64_t(p.max_pages_per_seq) * p.page_size : p.seqlen_k;
    spec.key_block = decode_key_block_for(spec, int64_t(p.batch) * keys * p.heads_kv, backend);
  }
  return spec;
}

} // namespace flashjit
