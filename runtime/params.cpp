#include "runtime/params.hpp"

#include <cmath>
#include <numbers>

namespace flashjit {
namespace {

fj_tensor_ref tensor_ref(const void *ptr, const flashjit_strides &s) {
  return fj_tensor_ref{ptr, s.batch, s.token, s.head};
}

} // namespace

fj_attention_params make_attention_params(const NormalizedProblem &n) {
  const flashjit_problem &p = n.p;
  fj_attention_params params{};
  params.q = tensor_ref(p.q, p.q_strides);
  params.k = tensor_ref(p.k, p.k_strides);
  params.v = tensor_ref(p.v, p.v_strides);
  params.o = tensor_ref(p.o, p.o_strides);
  params.maybe_lse = p.lse;
  params.maybe_cu_seqlens_q = p.cu_seqlens_q;
  params.maybe_cu_seqlens_k = n.paged ? nullptr : p.cu_seqlens_k;
  params.maybe_seqlens_k = n.paged ? p.seqlens_k : nullptr;
  if (n.paged) {
    params.paged.block_table = p.block_table;
    params.paged.max_pages_per_seq = p.max_pages_per_seq;
    params.paged.page_size = p.page_size;
    params.paged.page_stride_k = p.k_strides.batch;
    params.paged.page_stride_v = p.v_strides.batch;
  }
  params.batch = p.batch;
  params.seqlen_q = p.seqlen_q;
  params.seqlen_k = p.seqlen_k;
  params.total_q = n.varlen ? p.total_q : p.batch * p.seqlen_q;
  params.heads_q = p.heads_q;
  params.heads_kv = p.heads_kv;
  params.group = n.group;
  params.window_left = p.window_left;
  params.window_right = p.window_right;
  params.scale = p.scale;
  params.scale_log2 = p.scale * std::numbers::log2e_v<float>;
  params.softcap = p.softcap;
  params.softcap_inv = p.softcap > 0 ? 1.0f / p.softcap : 0.0f;
  return params;
}

} // namespace flashjit
