// Float64 reference attention and the helpers every numerical test shares: 16-bit conversions,
// seeded random inputs, the pass rule, and paged-KV construction.
//
// Tensors use the packed varlen layout (batch mode is the special case of equal lengths):
//   Q [total_q, heads_q, head_dim_qk]   K [total_k, heads_kv, head_dim_qk]   V [total_k, heads_kv, head_dim_v]
//   O [total_q, heads_q, head_dim_v]    LSE [heads_q, total_q] (natural log)
// Inputs are float vectors whose values are exactly representable in the 16-bit dtype under test,
// so the reference and a kernel see the same numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace flashjit::ref {

// ---------------------------------------------------------------------------------------------
// 16-bit floating point (round to nearest even; inf and NaN preserved; fp16 subnormals exact)

enum class Dtype { fp16, bf16 };

const char *dtype_name(Dtype dtype); // "fp16" | "bf16"

uint16_t float_to_bf16(float value);
float bf16_to_float(uint16_t bits);
uint16_t float_to_fp16(float value);
float fp16_to_float(uint16_t bits);

uint16_t to_bits(Dtype dtype, float value);
float from_bits(Dtype dtype, uint16_t bits);
// The nearest value representable in `dtype`, as a float.
float round_to(Dtype dtype, float value);

// ---------------------------------------------------------------------------------------------
// The problem

// Which keys a query row may attend to. Causal and window are aligned bottom-right: query i of a
// sequence with seqlen_q queries and seqlen_k keys sits at key position i + seqlen_k - seqlen_q.
struct Mask {
  bool causal = false;
  int window_left = -1;  // < 0: unbounded
  int window_right = -1; // < 0: unbounded (causal caps it at 0)

  bool operator==(const Mask &) const = default;
};

// Half-open key interval [begin, end); empty when begin >= end.
struct KeyInterval {
  int begin = 0;
  int end = 0;
  bool empty() const { return begin >= end; }
  int size() const { return empty() ? 0 : end - begin; }
};

// The per-pair predicate, written as directly from the definition as possible (the naive reference uses it).
bool is_visible(const Mask &mask, int query, int key, int seqlen_q, int seqlen_k);
// The visible keys of one query row as an interval (the mask is always one interval); tiled code uses it.
KeyInterval visible_keys(const Mask &mask, int query, int seqlen_q, int seqlen_k);

struct Problem {
  int batch = 1;
  std::vector<int> seqlens_q, seqlens_k; // one entry per sequence; zero lengths are allowed
  int heads_q = 1, heads_kv = 1;
  int head_dim_qk = 64, head_dim_v = 64;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0; // > 0: logit = softcap * tanh(s * scale / softcap)
  float scale = 0;   // 0: 1 / sqrt(head_dim_qk)

  // Batch mode: every sequence has the same lengths.
  static Problem dense(int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv, int head_dim_qk,
                       int head_dim_v);

  Mask mask() const { return {causal, window_left, window_right}; }
  float softmax_scale() const;
  int group() const { return heads_q / heads_kv; } // query heads per KV head (GQA)
  int kv_head(int head_q) const { return head_q / group(); }
  int total_q() const;
  int total_k() const;
  int max_seqlen_q() const;
  int max_seqlen_k() const;
  std::vector<int32_t> cu_seqlens_q() const; // [batch + 1] prefix sums
  std::vector<int32_t> cu_seqlens_k() const;
  size_t q_size() const { return size_t(total_q()) * heads_q * head_dim_qk; }
  size_t k_size() const { return size_t(total_k()) * heads_kv * head_dim_qk; }
  size_t v_size() const { return size_t(total_k()) * heads_kv * head_dim_v; }
  size_t o_size() const { return size_t(total_q()) * heads_q * head_dim_v; }
  size_t lse_size() const { return size_t(heads_q) * total_q(); }
  // Throws std::invalid_argument naming the first inconsistency.
  void validate() const;
  // "b2 sq[5,1] sk[9,0] h8/2 d64v64 causal wl-1 wr-1 softcap0", for test names and messages.
  std::string describe() const;
};

// ---------------------------------------------------------------------------------------------
// body(0) .. body(count - 1) on all cores, items handed out in order; each item must write only its
// own results (the references compute query rows this way, deterministically whatever the core count).
void parallel_for(size_t count, const std::function<void(size_t)> &body);

// ---------------------------------------------------------------------------------------------
// Reference attention

struct Output {
  std::vector<double> o;   // [total_q, heads_q, head_dim_v]
  std::vector<double> lse; // [heads_q, total_q]; -inf for a row that sees no key (its O row is 0)
};

// Exact semantics in float64.
Output attention_f64(const Problem &problem, std::span<const float> q, std::span<const float> k,
                     std::span<const float> v);
// "naive_lowprec" of the pass rule: fp32 accumulation, the normalized P rounded to `dtype` before
// P·V (as the kernels feed P to the tensor cores), O rounded to `dtype`. LSE stays fp32.
Output attention_lowprec(const Problem &problem, std::span<const float> q, std::span<const float> k,
                         std::span<const float> v, Dtype dtype);

// Batch-mode LSE layout [batch, heads_q, seqlen_q] from the packed [heads_q, total_q] (equal seqlens_q).
std::vector<double> lse_batch_major(const Problem &problem, std::span<const double> lse);
// Human-readable coordinates of a flat index, for failure messages.
std::string o_coordinates(const Problem &problem, size_t index);
std::string lse_coordinates(const Problem &problem, size_t index);

// ---------------------------------------------------------------------------------------------
// The pass rule: max|ours - ref64| <= 2 * max|naive - ref64| + 1e-5, over every element.
// A non-finite reference value (a -inf LSE) must be matched exactly by ours and by naive; a
// non-finite value of ours where the reference is finite fails.

struct CheckResult {
  bool pass = false;
  double max_err = 0;     // max |ours - ref64| over finite reference elements
  double naive_err = 0;   // max |naive - ref64|
  double bound = 0;       // 2 * naive_err + 1e-5
  size_t worst_index = 0; // the element with max_err, or the first non-finite mismatch
  size_t nonfinite = 0;   // elements of ours that are NaN/inf where they should not be
  size_t count = 0;       // elements checked
  std::string summary;    // one line: verdict, worst element's index and values, errors
};

CheckResult check_output(std::span<const float> ours, std::span<const double> ref64, std::span<const double> naive,
                         const std::string &name = "O");
CheckResult check_lse(std::span<const float> ours, std::span<const double> ref64, std::span<const double> naive);

// ---------------------------------------------------------------------------------------------
// Random inputs

// Normal(0, scale) values rounded to `dtype`, reproducible from `seed` on every platform; never all zeros.
// Large tensors are filled by every core, chunk by chunk of one stream: the values do not depend on
// `parallel` or the core count (benchmarks of 100M+ elements spent seconds here on one core).
std::vector<float> random_tensor(size_t n, Dtype dtype, uint64_t seed, float scale = 1, bool parallel = true);

struct Inputs {
  std::vector<float> q, k, v;
};
// Q, K and V for `problem`, each from its own seed derived from `seed`.
Inputs random_inputs(const Problem &problem, Dtype dtype, uint64_t seed, float scale = 1);

// max |a - b| over all elements; equal infinities count as 0, any other non-finite pair (or a size
// mismatch) as +inf. For comparing two references or a model against a reference.
double max_abs_diff(std::span<const double> a, std::span<const double> b);

// ---------------------------------------------------------------------------------------------
// Paged KV: pages [num_pages, page_size, heads_kv, d] addressed through block_table [batch, max_pages_per_seq].

enum class PageGarbage {
  large, // finite values of magnitude 64..120: a kernel that gathers the wrong page gets a large error
  nan,   // NaN: also catches a kernel that lets a masked row's V reach the output (0 * NaN)
};

struct PagedKv {
  int page_size = 0;
  int num_pages = 0;
  int max_pages_per_seq = 0;
  int heads_kv = 0, head_dim_qk = 0, head_dim_v = 0;
  std::vector<int> seqlens_k;
  std::vector<int32_t> block_table; // [batch, max_pages_per_seq]; padding entries name a garbage page
  std::vector<float> k_pages;       // [num_pages, page_size, heads_kv, head_dim_qk]
  std::vector<float> v_pages;       // [num_pages, page_size, heads_kv, head_dim_v]

  int page_of(int seq, int key) const { return block_table[size_t(seq) * max_pages_per_seq + key / page_size]; }
  // Element offsets of key `key` of sequence `seq`, KV head `head_kv`, into k_pages / v_pages.
  size_t k_offset(int seq, int key, int head_kv) const { return (slot(seq, key) * heads_kv + head_kv) * head_dim_qk; }
  size_t v_offset(int seq, int key, int head_kv) const { return (slot(seq, key) * heads_kv + head_kv) * head_dim_v; }
  const float *k_row(int seq, int key, int head_kv) const { return &k_pages[k_offset(seq, key, head_kv)]; }
  const float *v_row(int seq, int key, int head_kv) const { return &v_pages[v_offset(seq, key, head_kv)]; }

private:
  size_t slot(int seq, int key) const { return size_t(page_of(seq, key)) * page_size + key % page_size; }
};

// Scatters contiguous packed K/V into pages in a seeded random order. Every slot that holds no key
// (spare pages, the tail of each sequence's last page) is filled with `garbage`.
PagedKv make_paged_kv(const Problem &problem, std::span<const float> k, std::span<const float> v, int page_size,
                      uint64_t seed, PageGarbage garbage = PageGarbage::large);

struct KvTensors {
  std::vector<float> k, v; // packed [total_k, heads_kv, d]
};
// Reads the pages back through the block table into the packed layout.
KvTensors gather_paged(const PagedKv &paged);

} // namespace flashjit::ref
