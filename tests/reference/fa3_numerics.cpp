#include "tests/reference/fa3_numerics.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace flashjit::ref {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLazyRescaleLog2 = 8.0f; // softmax.cuh
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Row {
  int seq, token, head; // token: row within its sequence
};

// One query row: O (rounded to the dtype) into `o`, the LSE into `lse`.
void row_attention(const Problem &problem, const Row &row, std::span<const float> q, std::span<const float> k,
                   std::span<const float> v, Dtype dtype, const Fa3Numerics &numerics, const int32_t *cu_q,
                   const int32_t *cu_k, double *o, double *lse) {
  const int dqk = problem.head_dim_qk, dv = problem.head_dim_v;
  const int sq = problem.seqlens_q[row.seq], sk = problem.seqlens_k[row.seq];
  const int head_kv = problem.kv_head(row.head);
  const float c = problem.softmax_scale() * kLog2e;
  const KeyInterval visible = visible_keys(problem.mask(), row.token, sq, sk);
  const float *q_row = &q[(size_t(cu_q[row.seq] + row.token) * problem.heads_q + row.head) * dqk];
  std::vector<float> s(std::max(sk, 0), kNegInf);
  for (int j = visible.begin; j < visible.end; ++j) {
    const float *k_row = &k[(size_t(cu_k[row.seq] + j) * problem.heads_kv + head_kv) * dqk];
    double dot = 0;
    for (int d = 0; d < dqk; ++d)
      dot += double(q_row[d]) * k_row[d];
    s[j] = float(dot); // the tensor cores' fp32 result, up to the order of their sums
  }
  float max = kNegInf, sum = 0, top_rounding = 0;
  std::vector<float> acc(dv, 0.0f);
  const int n = numerics.block_n;
  for (int block = visible.empty() ? -1 : (visible.end - 1) / n; block >= 0; --block) {
    const int begin = block * n, end = std::min(sk, begin + n);
    float block_top = kNegInf;
    for (int j = begin; j < end; ++j)
      block_top = std::max(block_top, s[j]);
    float block_max = std::max(max, block_top);
    const bool keep_max = numerics.lazy_rescale && max != kNegInf && (block_max - max) * c <= kLazyRescaleLog2;
    if (keep_max)
      block_max = max;
    const float safe_max = block_max == kNegInf ? 0.0f : block_max;
    const float bias = -safe_max * c;
    const float rescale = keep_max ? 1.0f : std::exp2((max - safe_max) * c);
    if (numerics.lazy_top_rounding) {
      const float top = keep_max ? std::exp2(std::fma(block_top, c, bias)) : 1.0f;
      top_rounding = top_rounding * rescale + (round_to(dtype, top) - top);
    }
    max = block_max;
    float block_sum = 0;
    for (float &a : acc)
      a *= rescale;
    for (int j = begin; j < end; ++j) {
      const float p = std::exp2(std::fma(s[j], c, bias));
      block_sum += p;
      const float p16 = round_to(dtype, p); // the P fed to P.V
      if (p16 == 0.0f)
        continue;
      const float *v_row = &v[(size_t(cu_k[row.seq] + j) * problem.heads_kv + head_kv) * dv];
      for (int d = 0; d < dv; ++d)
        acc[d] = std::fma(p16, v_row[d], acc[d]);
    }
    sum = sum * rescale + block_sum;
  }
  const float normalizer = sum + top_rounding;
  const float inverse = normalizer > 0 ? 1.0f / normalizer : 0.0f;
  for (int d = 0; d < dv; ++d)
    o[d] = round_to(dtype, acc[d] * inverse);
  *lse = sum > 0 ? double((max * c + std::log2(sum)) * kLn2) : -std::numeric_limits<double>::infinity();
}

} // namespace

Output fa3_numerics_attention(const Problem &problem, std::span<const float> q, std::span<const float> k,
                              std::span<const float> v, Dtype dtype, const Fa3Numerics &numerics) {
  problem.validate();
  if (problem.softcap > 0)
    throw std::invalid_argument("fa3_numerics_attention: softcap is not modeled");
  if (numerics.block_n <= 0 || (numerics.lazy_top_rounding && !numerics.lazy_rescale))
    throw std::invalid_argument("fa3_numerics_attention: block_n > 0; the top rounding needs lazy rescaling");
  const std::vector<int32_t> cu_q = problem.cu_seqlens_q(), cu_k = problem.cu_seqlens_k();
  std::vector<Row> rows;
  for (int seq = 0; seq < problem.batch; ++seq)
    for (int token = 0; token < problem.seqlens_q[seq]; ++token)
      for (int head = 0; head < problem.heads_q; ++head)
        rows.push_back({seq, token, head});
  Output out;
  out.o.resize(problem.o_size());
  out.lse.resize(problem.lse_size());
  const int total_q = problem.total_q();
  parallel_for(rows.size(), [&](size_t i) {
    const Row &r = rows[i];
    const size_t token = size_t(cu_q[r.seq] + r.token);
    row_attention(problem, r, q, k, v, dtype, numerics, cu_q.data(), cu_k.data(),
                  &out.o[(token * problem.heads_q + r.head) * problem.head_dim_v],
                  &out.lse[size_t(r.head) * total_q + token]);
  });
  return out;
}

} // namespace flashjit::ref
