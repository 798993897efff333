#include "tests/harness/device_case.hpp"

#include "runtime/driver.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace flashjit::harness {
namespace {

const driver::Api *api_or(Status *status) {
  std::string error;
  const driver::Api *api = driver::api(&error);
  if (!api)
    *status = Status::error(FLASHJIT_DRIVER_ERROR, error);
  return api;
}

#define HARNESS_CHECK(call, what)                                                                                      \
  do {                                                                                                                 \
    CUresult r_ = (call);                                                                                              \
    if (r_ != CUDA_SUCCESS)                                                                                            \
      return driver::driver_error(what, r_);                                                                           \
  } while (0)

constexpr unsigned char kNanByte = 0xFF; // 0xFFFF is a NaN in fp16 and bf16, 0xFFFFFFFF in float32

std::vector<uint16_t> to_bits(ref::Dtype dtype, const std::vector<float> &values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    bits[i] = ref::to_bits(dtype, values[i]);
  return bits;
}

// Host tensors in the device layout: [rows, heads, dim] with `row_padding` extra elements per row.
std::vector<uint16_t> with_padding(const std::vector<uint16_t> &packed, int rows, int heads, int dim, int padding) {
  if (padding == 0)
    return packed;
  const size_t row = size_t(heads) * dim;
  std::vector<uint16_t> padded(size_t(rows) * (row + padding), ref::to_bits(ref::Dtype::bf16, 7.0f));
  for (int r = 0; r < rows; ++r)
    std::copy_n(packed.begin() + r * row, row, padded.begin() + r * (row + padding));
  return padded;
}

// [batch * tokens, heads, dim] (the reference's batch-mode layout) <-> [batch, heads, tokens, dim].
template <typename T>
std::vector<T> permute_head_major(const std::vector<T> &from, int batch, int tokens, int heads, int dim,
                                  bool to_head_major) {
  std::vector<T> to(from.size());
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < tokens; ++t)
      for (int h = 0; h < heads; ++h) {
        const size_t token_major = ((size_t(b) * tokens + t) * heads + h) * dim;
        const size_t head_major = ((size_t(b) * heads + h) * tokens + t) * dim;
        std::copy_n(from.begin() + (to_head_major ? token_major : head_major), dim,
                    to.begin() + (to_head_major ? head_major : token_major));
      }
  return to;
}

// Strides (elements) of [batch, heads, tokens, dim].
flashjit_strides head_major_strides(int tokens, int heads, int dim) {
  return {int64_t(heads) * tokens * dim, dim, int64_t(tokens) * dim};
}

struct DeviceTensors {
  DeviceBuffer q, k, v, o, lse, cu_q, cu_k, block_table, seqlens_k, workspace;
  // Host copies the problem points at, so validation can check them.
  std::vector<int32_t> cu_q_host, cu_k_host, lens_host, table_host;
};

Status upload_vector(DeviceBuffer *buffer, const void *data, size_t bytes) {
  if (Status s = buffer->allocate(std::max<size_t>(bytes, 16)); !s)
    return s;
  return bytes ? buffer->upload(data, bytes) : Status::success();
}

// Strides (elements) of token-major pages [num_pages, page, heads, dim] with `gap_bytes` between pages.
flashjit_strides gapped_page_strides(int page_size, int heads, int dim, size_t gap_bytes) {
  constexpr size_t kElementBytes = 2;
  const int64_t page_elements = int64_t(page_size) * heads * dim;
  return {page_elements + int64_t(gap_bytes / kElementBytes), int64_t(heads) * dim, dim};
}

// Pages of `bits` (contiguous [num_pages, page elements]) each at its page stride; the gaps stay unwritten.
Status upload_pages(DeviceBuffer *buffer, const std::vector<uint16_t> &bits, int num_pages, int64_t page_stride) {
  constexpr size_t kElementBytes = 2;
  const size_t page_elements = bits.size() / size_t(num_pages);
  if (Status s = buffer->allocate(size_t(page_stride) * kElementBytes * size_t(num_pages)); !s)
    return s;
  for (int page = 0; page < num_pages; ++page)
    if (Status s = buffer->upload_at(size_t(page) * size_t(page_stride) * kElementBytes,
                                     bits.data() + size_t(page) * page_elements, page_elements * kElementBytes);
        !s)
      return s;
  return Status::success();
}

// Builds the device tensors and the AttentionProblem for `options`.
Status setup(const CaseOptions &options, const std::vector<float> &q, const std::vector<float> &k,
             const std::vector<float> &v, DeviceTensors *t, AttentionProblem *p) {
  const ref::Problem &rp = options.problem;
  const int pad = options.row_padding;
  if (options.head_major && (options.varlen || pad != 0))
    return Status::error(FLASHJIT_INVALID_ARGUMENT, "head_major: batch mode without row padding");
  if (options.page_gap_bytes != 0 && (options.head_major || options.page_gap_bytes % 16 != 0))
    return Status::error(FLASHJIT_INVALID_ARGUMENT, "page_gap_bytes: token-major pages, a multiple of 16 bytes");
  describe_problem(options, p);

  const int total_q = rp.total_q(), total_k = rp.total_k();
  auto q_dev = with_padding(to_bits(options.dtype, q), total_q, rp.heads_q, rp.head_dim_qk, pad);
  if (Status s = upload_vector(&t->q, q_dev.data(), q_dev.size() * 2); !s)
    return s;
  const int64_t o_row = int64_t(rp.heads_q) * rp.head_dim_v + pad;
  p->q = t->q.get();
  if (Status s = t->o.allocate(size_t(total_q) * o_row * 2 + 16); !s)
    return s;
  if (Status s = t->o.fill_bytes(kNanByte); !s)
    return s;
  p->o = t->o.get();
  if (options.with_lse) {
    if (Status s = t->lse.allocate(size_t(total_q) * rp.heads_q * sizeof(float) + 16); !s)
      return s;
    if (Status s = t->lse.fill_bytes(kNanByte); !s)
      return s;
    p->lse = static_cast<float *>(t->lse.get());
  }

  if (options.page_size > 0) {
    ref::PagedKv paged = ref::make_paged_kv(rp, k, v, options.page_size, options.seed * 7 + 3,
                                            options.page_garbage_nan ? ref::PageGarbage::nan : ref::PageGarbage::large);
    auto k_bits = to_bits(options.dtype, paged.k_pages), v_bits = to_bits(options.dtype, paged.v_pages);
    if (options.head_major) { // pages [num_pages, heads, page, dim] (FlashInfer's HND)
      k_bits = permute_head_major(k_bits, paged.num_pages, paged.page_size, rp.heads_kv, rp.head_dim_qk, true);
      v_bits = permute_head_major(v_bits, paged.num_pages, paged.page_size, rp.heads_kv, rp.head_dim_v, true);
    }
    if (options.page_gap_bytes != 0) {
      if (Status s = upload_pages(&t->k, k_bits, paged.num_pages, p->k_strides.batch); !s)
        return s;
      if (Status s = upload_pages(&t->v, v_bits, paged.num_pages, p->v_strides.batch); !s)
        return s;
    } else {
      if (Status s = upload_vector(&t->k, k_bits.data(), k_bits.size() * 2); !s)
        return s;
      if (Status s = upload_vector(&t->v, v_bits.data(), v_bits.size() * 2); !s)
        return s;
    }
    if (Status s = upload_vector(&t->block_table, paged.block_table.data(), paged.block_table.size() * 4); !s)
      return s;
    std::vector<int32_t> lens(paged.seqlens_k.begin(), paged.seqlens_k.end());
    if (Status s = upload_vector(&t->seqlens_k, lens.data(), lens.size() * 4); !s)
      return s;
    p->k = t->k.get();
    p->v = t->v.get();
    p->block_table = static_cast<const int32_t *>(t->block_table.get());
    p->seqlens_k = static_cast<const int32_t *>(t->seqlens_k.get());
    p->page_size = paged.page_size;
    p->max_pages_per_seq = paged.max_pages_per_seq;
    p->num_pages = paged.num_pages;
    t->lens_host = lens;
    t->table_host = paged.block_table;
    p->seqlens_k_host = t->lens_host.data();
    p->block_table_host = t->table_host.data();
  } else {
    auto k_dev = with_padding(to_bits(options.dtype, k), total_k, rp.heads_kv, rp.head_dim_qk, pad);
    auto v_dev = with_padding(to_bits(options.dtype, v), total_k, rp.heads_kv, rp.head_dim_v, pad);
    if (Status s = upload_vector(&t->k, k_dev.data(), k_dev.size() * 2); !s)
      return s;
    if (Status s = upload_vector(&t->v, v_dev.data(), v_dev.size() * 2); !s)
      return s;
    p->k = t->k.get();
    p->v = t->v.get();
  }
  if (options.head_major) { // Q; K and V too unless paged (above)
    const int b = rp.batch, sq = p->seqlen_q, sk = p->seqlen_k;
    auto q_hm = permute_head_major(q_dev, b, sq, rp.heads_q, rp.head_dim_qk, true);
    if (Status s = t->q.upload(q_hm.data(), q_hm.size() * 2); !s)
      return s;
    if (options.page_size == 0) {
      auto k_hm = permute_head_major(to_bits(options.dtype, k), b, sk, rp.heads_kv, rp.head_dim_qk, true);
      auto v_hm = permute_head_major(to_bits(options.dtype, v), b, sk, rp.heads_kv, rp.head_dim_v, true);
      for (auto [buffer, bits] : {std::pair{&t->k, &k_hm}, {&t->v, &v_hm}})
        if (Status s = buffer->upload(bits->data(), bits->size() * 2); !s)
          return s;
    }
  }
  if (options.varlen) {
    std::vector<int32_t> &cu_q_host = t->cu_q_host, &cu_k_host = t->cu_k_host;
    cu_q_host = rp.cu_seqlens_q();
    cu_k_host = rp.cu_seqlens_k();
    if (Status s = upload_vector(&t->cu_q, cu_q_host.data(), cu_q_host.size() * 4); !s)
      return s;
    p->cu_seqlens_q = static_cast<const int32_t *>(t->cu_q.get());
    p->cu_seqlens_q_host = cu_q_host.data();
    p->total_q = total_q;
    if (options.page_size == 0) {
      if (Status s = upload_vector(&t->cu_k, cu_k_host.data(), cu_k_host.size() * 4); !s)
        return s;
      p->cu_seqlens_k = static_cast<const int32_t *>(t->cu_k.get());
      p->cu_seqlens_k_host = cu_k_host.data();
      p->total_k = total_k;
    }
  }
  return Status::success();
}

} // namespace

void describe_problem(const CaseOptions &options, AttentionProblem *p) {
  const ref::Problem &rp = options.problem;
  p->dtype = options.dtype == ref::Dtype::fp16 ? FLASHJIT_FP16 : FLASHJIT_BF16;
  p->batch = rp.batch;
  p->seqlen_q = rp.max_seqlen_q();
  p->seqlen_k = rp.max_seqlen_k();
  p->heads_q = rp.heads_q;
  p->heads_kv = rp.heads_kv;
  p->head_dim_qk = rp.head_dim_qk;
  p->head_dim_v = rp.head_dim_v;
  p->causal = rp.causal;
  p->window_left = rp.window_left;
  p->window_right = rp.window_right;
  p->softcap = rp.softcap;
  p->scale = rp.scale;
  // Token-major [batch, tokens, heads, dim] with row_padding elements after each token's heads.
  const auto token_major = [pad = options.row_padding](int tokens, int heads, int dim) {
    const int64_t row = int64_t(heads) * dim + pad;
    return flashjit_strides{row * tokens, row, dim};
  };
  const bool paged = options.page_size > 0;
  if (options.head_major) {
    p->q_strides = head_major_strides(p->seqlen_q, rp.heads_q, rp.head_dim_qk);
    p->o_strides = head_major_strides(p->seqlen_q, rp.heads_q, rp.head_dim_v);
  } else {
    p->q_strides = token_major(p->seqlen_q, rp.heads_q, rp.head_dim_qk);
    p->o_strides = token_major(p->seqlen_q, rp.heads_q, rp.head_dim_v);
  }
  if (paged && options.head_major) { // pages [num_pages, heads, page, dim] (FlashInfer's HND)
    p->k_strides = head_major_strides(options.page_size, rp.heads_kv, rp.head_dim_qk);
    p->v_strides = head_major_strides(options.page_size, rp.heads_kv, rp.head_dim_v);
  } else if (paged && options.page_gap_bytes != 0) {
    p->k_strides = gapped_page_strides(options.page_size, rp.heads_kv, rp.head_dim_qk, options.page_gap_bytes);
    p->v_strides = gapped_page_strides(options.page_size, rp.heads_kv, rp.head_dim_v, options.page_gap_bytes);
  } else if (paged) { // zero: packed pages [num_pages, page, heads, dim]
    p->k_strides = p->v_strides = flashjit_strides{};
  } else if (options.head_major) {
    p->k_strides = head_major_strides(p->seqlen_k, rp.heads_kv, rp.head_dim_qk);
    p->v_strides = head_major_strides(p->seqlen_k, rp.heads_kv, rp.head_dim_v);
  } else {
    p->k_strides = token_major(p->seqlen_k, rp.heads_kv, rp.head_dim_qk);
    p->v_strides = token_major(p->seqlen_k, rp.heads_kv, rp.head_dim_v);
  }
  if (options.varlen) { // packed rows: no batch stride (pages keep theirs)
    p->q_strides.batch = p->o_strides.batch = 0;
    if (!paged)
      p->k_strides.batch = p->v_strides.batch = 0;
  }
}

namespace {

// prepare(), then forward() captured into a graph on a fresh stream, then one replay.
Status forward_in_graph(Runtime &runtime, const AttentionProblem &problem) {
  if (Status s = runtime.prepare(problem); !s)
    return s;
  const driver::Api *api = driver::api();
  CUstream stream = nullptr;
  HARNESS_CHECK(api->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  Status status;
  if (CUresult r = api->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL); r != CUDA_SUCCESS) {
    status = driver::driver_error("cuStreamBeginCapture", r);
  } else {
    Status launched = runtime.forward(problem, reinterpret_cast<flashjit_stream>(stream));
    CUresult r_end = api->cuStreamEndCapture(stream, &graph);
    if (!launched)
      status = launched;
    else if (r_end != CUDA_SUCCESS)
      status = driver::driver_error("cuStreamEndCapture (forward did something a capture forbids)", r_end);
    else if (CUresult r_inst = api->cuGraphInstantiateWithFlags(&exec, graph, 0); r_inst != CUDA_SUCCESS)
      status = driver::driver_error("cuGraphInstantiate", r_inst);
    else if (CUresult r_launch = api->cuGraphLaunch(exec, stream); r_launch != CUDA_SUCCESS)
      status = driver::driver_error("cuGraphLaunch", r_launch);
    else if (CUresult r_sync = api->cuStreamSynchronize(stream); r_sync != CUDA_SUCCESS)
      status = driver::driver_error("graph replay", r_sync);
  }
  if (exec)
    api->cuGraphExecDestroy(exec);
  if (graph)
    api->cuGraphDestroy(graph);
  api->cuStreamDestroy(stream);
  return status;
}

// O and LSE back to NaN, as setup left them (between the forward() calls of one case).
Status poison_outputs(DeviceTensors *t) {
  if (Status s = t->o.fill_bytes(kNanByte); !s)
    return s;
  return t->lse.get() ? t->lse.fill_bytes(kNanByte) : Status::success();
}

// Size, allocate and plan the workspace the problem's kernel asks for (split-K decode, fa3 tail
// split); none when it asks for none.
Status attach_workspace(Runtime &runtime, const CaseOptions &options, DeviceTensors *t, AttentionProblem *p) {
  if (!options.with_workspace)
    return Status::success();
  size_t bytes = 0;
  if (Status s = runtime.workspace_size(*p, &bytes); !s)
    return s;
  if (bytes == 0)
    return Status::success();
  const size_t granted = bytes > options.workspace_shortfall ? bytes - options.workspace_shortfall : 0;
  if (Status s = t->workspace.allocate(std::max<size_t>(granted, 256)); !s)
    return s;
  p->workspace = t->workspace.get();
  p->workspace_bytes = granted;
  return runtime.plan(*p);
}

bool equal_lengths(const std::vector<int> &lens) {
  return std::adjacent_find(lens.begin(), lens.end(), std::not_equal_to<>()) == lens.end();
}

} // namespace

DeviceSession::~DeviceSession() {
  if (context_)
    if (const driver::Api *api = driver::api())
      api->cuDevicePrimaryCtxRelease(device_);
}

Status DeviceSession::open(int ordinal) {
  Status status;
  const driver::Api *api = api_or(&status);
  if (!api)
    return status;
  int count = 0;
  HARNESS_CHECK(api->cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (ordinal >= count)
    return Status::error(FLASHJIT_DRIVER_ERROR,
                         "no CUDA device " + std::to_string(ordinal) + " (" + std::to_string(count) + " present)");
  HARNESS_CHECK(api->cuDeviceGet(&device_, ordinal), "cuDeviceGet");
  HARNESS_CHECK(api->cuDevicePrimaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain");
  HARNESS_CHECK(api->cuCtxSetCurrent(context_), "cuCtxSetCurrent");
  char name[256] = {};
  api->cuDeviceGetName(name, sizeof(name), device_);
  name_ = name;
  return Status::success();
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_)
    if (const driver::Api *api = driver::api())
      api->cuMemFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer &&other) noexcept : ptr_(other.ptr_), bytes_(other.bytes_) {
  other.ptr_ = 0;
  other.bytes_ = 0;
}

DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&other) noexcept {
  std::swap(ptr_, other.ptr_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

Status DeviceBuffer::allocate(size_t bytes) {
  Status status;
  const driver::Api *api = api_or(&status);
  if (!api)
    return status;
  if (ptr_)
    api->cuMemFree(ptr_);
  ptr_ = 0;
  HARNESS_CHECK(api->cuMemAlloc(&ptr_, bytes), "cuMemAlloc(" + std::to_string(bytes) + " bytes)");
  bytes_ = bytes;
  return Status::success();
}

Status DeviceBuffer::upload(const void *host, size_t bytes) {
  HARNESS_CHECK(driver::api()->cuMemcpyHtoD(ptr_, host, bytes), "cuMemcpyHtoD");
  return Status::success();
}

Status DeviceBuffer::upload_at(size_t offset, const void *host, size_t bytes) {
  if (offset + bytes > bytes_)
    return Status::error(FLASHJIT_INVALID_ARGUMENT, "upload_at: past the buffer's end");
  HARNESS_CHECK(driver::api()->cuMemcpyHtoD(ptr_ + offset, host, bytes), "cuMemcpyHtoD");
  return Status::success();
}

Status DeviceBuffer::download(void *host, size_t bytes) const {
  HARNESS_CHECK(driver::api()->cuMemcpyDtoH(host, ptr_, bytes), "cuMemcpyDtoH");
  return Status::success();
}

Status DeviceBuffer::fill_bytes(unsigned char value) {
  HARNESS_CHECK(driver::api()->cuMemsetD8(ptr_, value, bytes_), "cuMemsetD8");
  return Status::success();
}

std::optional<ref::Fa3Numerics> fa3_numerics_of_kernel(std::string_view kernel) {
  if (!kernel.starts_with("prefill.fa3."))
    return std::nullopt;
  const size_t tile = kernel.find(".m");
  const size_t n = kernel.find('n', tile);
  if (tile == std::string_view::npos || n == std::string_view::npos)
    return std::nullopt;
  ref::Fa3Numerics numerics;
  numerics.block_n = std::stoi(std::string(kernel.substr(n + 1)));
  numerics.lazy_top_rounding = kernel.find(".lzt.") != std::string_view::npos;
  numerics.lazy_rescale = numerics.lazy_top_rounding || kernel.find(".lz.") != std::string_view::npos;
  return numerics;
}

std::string CaseResult::summary() const {
  std::ostringstream out;
  out << (pass() ? "PASS" : "FAIL") << " " << kernel;
  if (!status.ok())
    out << " status: " << status.message;
  else
    out << "\n  O:   " << o.summary << (lse.count ? "\n  LSE: " + lse.summary : "")
        << (model.count ? "\n  fa3 model: " + model.summary : "");
  return out.str();
}

double attention_flops(const ref::Problem &p) {
  double flops = 0;
  for (int b = 0; b < p.batch; ++b)
    flops += 2.0 * p.seqlens_q[b] * p.seqlens_k[b] * p.heads_q * (p.head_dim_qk + p.head_dim_v);
  return p.causal ? flops / 2 : flops;
}

CaseResult run_case(Runtime &runtime, const CaseOptions &options) {
  CaseResult result;
  const ref::Problem &rp = options.problem;
  if (!options.varlen && (!equal_lengths(rp.seqlens_q) || !equal_lengths(rp.seqlens_k))) {
    result.status = Status::error(FLASHJIT_INVALID_ARGUMENT, "batch mode needs equal lengths; use varlen");
    return result;
  }
  auto q = ref::random_tensor(rp.q_size(), options.dtype, options.seed);
  auto k = ref::random_tensor(rp.k_size(), options.dtype, options.seed + 1);
  auto v = ref::random_tensor(rp.v_size(), options.dtype, options.seed + 2);
  if (options.shape_inputs) {
    options.shape_inputs(q, k, v);
    for (std::vector<float> *x : {&q, &k, &v}) // what the device gets, for the references too
      for (float &value : *x)
        value = ref::round_to(options.dtype, value);
  }
  DeviceTensors tensors;
  AttentionProblem problem;
  if (result.status = setup(options, q, k, v, &tensors, &problem); !result.status)
    return result;
  if (result.status = attach_workspace(runtime, options, &tensors, &problem); !result.status)
    return result;
  Explanation explanation;
  if (runtime.explain(problem, &explanation))
    result.kernel = explanation.kernel;
  for (int call = 0; call < std::max(options.forwards, 1); ++call) {
    if (call > 0)
      if (result.status = poison_outputs(&tensors); !result.status)
        return result;
    if (result.status = options.graph_capture ? forward_in_graph(runtime, problem) : runtime.forward(problem);
        !result.status)
      return result;
  }
  if (CUresult r = driver::api()->cuCtxSynchronize(); r != CUDA_SUCCESS) {
    result.status = driver::driver_error("kernel execution (cuCtxSynchronize)", r);
    return result;
  }
  const int pad = options.row_padding;
  const int total_q = rp.total_q();
  const size_t o_row = size_t(rp.heads_q) * rp.head_dim_v;
  std::vector<uint16_t> o_dev(size_t(total_q) * (o_row + pad));
  if (result.status = tensors.o.download(o_dev.data(), o_dev.size() * 2); !result.status)
    return result;
  if (options.head_major)
    o_dev = permute_head_major(o_dev, rp.batch, rp.max_seqlen_q(), rp.heads_q, rp.head_dim_v, false);
  std::vector<float> o(size_t(total_q) * o_row);
  for (int r = 0; r < total_q; ++r)
    for (size_t c = 0; c < o_row; ++c)
      o[r * o_row + c] = ref::from_bits(options.dtype, o_dev[r * (o_row + pad) + c]);
  const ref::Output ref64 = ref::attention_f64(rp, q, k, v);
  const ref::Output naive = ref::attention_lowprec(rp, q, k, v, options.dtype);
  result.o = ref::check_output(o, ref64.o, naive.o);
  result.o_values = std::move(o);
  if (options.fa3_model && rp.softcap == 0)
    if (const auto numerics = fa3_numerics_of_kernel(result.kernel)) {
      const ref::Output model = ref::fa3_numerics_attention(rp, q, k, v, options.dtype, *numerics);
      result.model = ref::check_output(std::vector<float>(model.o.begin(), model.o.end()), ref64.o, naive.o, "model O");
    }
  if (options.with_lse) {
    std::vector<float> lse(size_t(total_q) * rp.heads_q);
    if (result.status = tensors.lse.download(lse.data(), lse.size() * 4); !result.status)
      return result;
    if (options.varlen) {
      result.lse = ref::check_lse(lse, ref64.lse, naive.lse);
    } else {
      result.lse = ref::check_lse(lse, ref::lse_batch_major(rp, ref64.lse), ref::lse_batch_major(rp, naive.lse));
    }
  }
  return result;
}

BenchResult bench_case(Runtime &runtime, const CaseOptions &options, int iterations, const std::string &read_global) {
  BenchResult result;
  const ref::Problem &rp = options.problem;
  // Enough copies that the inputs of consecutive launches never share L2 (50 MB on an H200).
  constexpr size_t kL2Bytes = 64ull << 20;
  const size_t input_bytes = (rp.q_size() + rp.k_size() + rp.v_size()) * 2;
  const int copies = static_cast<int>(std::clamp<size_t>(2 * kL2Bytes / std::max<size_t>(input_bytes, 1) + 1, 2, 16));
  std::vector<DeviceTensors> tensors(copies);
  std::vector<AttentionProblem> problems(copies);
  for (int c = 0; c < copies; ++c) {
    const auto q = ref::random_tensor(rp.q_size(), options.dtype, options.seed + 10 * c);
    const auto k = ref::random_tensor(rp.k_size(), options.dtype, options.seed + 10 * c + 1);
    const auto v = ref::random_tensor(rp.v_size(), options.dtype, options.seed + 10 * c + 2);
    if (result.status = setup(options, q, k, v, &tensors[c], &problems[c]); !result.status)
      return result;
    if (result.status = attach_workspace(runtime, options, &tensors[c], &problems[c]); !result.status)
      return result;
  }
  Explanation explanation;
  if (runtime.explain(problems[0], &explanation))
    result.kernel = explanation.kernel;
  const driver::Api *api = driver::api();
  constexpr int kWarmup = 5;
  for (int i = 0; i < kWarmup; ++i)
    if (result.status = runtime.forward(problems[i % copies]); !result.status)
      return result;
  CUevent start = nullptr, stop = nullptr;
  api->cuEventCreate(&start, CU_EVENT_DEFAULT);
  api->cuEventCreate(&stop, CU_EVENT_DEFAULT);
  std::vector<float> times;
  for (int i = 0; i < iterations; ++i) {
    api->cuEventRecord(start, nullptr);
    if (result.status = runtime.forward(problems[i % copies]); !result.status)
      break;
    api->cuEventRecord(stop, nullptr);
    api->cuEventSynchronize(stop);
    float ms = 0;
    api->cuEventElapsedTime(&ms, start, stop);
    times.push_back(ms);
  }
  api->cuEventDestroy(start);
  api->cuEventDestroy(stop);
  if (!result.status || times.empty())
    return result;
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  result.median_ms = times[times.size() / 2];
  result.tflops = attention_flops(rp) / (result.median_ms * 1e-3) / 1e12;
  if (!read_global.empty())
    result.status = runtime.read_kernel_global(problems[(iterations - 1) % copies], read_global, &result.global);
  return result;
}

} // namespace flashjit::harness
