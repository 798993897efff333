// Kernel parameter blocks shared, byte for byte, by the host (runtime/) and the device templates.
// Plain C with fixed-width fields so both compilers agree on the layout; passed by value as
// `const __grid_constant__`. Strides count elements; every `maybe_` pointer may be null.
#pragma once

typedef int fj_i32;
typedef long long fj_i64;
typedef unsigned long long fj_u64;

#if defined(__cplusplus)
#define FJ_ALIGN64 alignas(64)
#else
#define FJ_ALIGN64 _Alignas(64)
#endif

// An encoded CUtensorMap (cuTensorMapEncodeTiled output): opaque, 128 bytes, 64-byte aligned.
typedef struct fj_tensor_map {
  FJ_ALIGN64 fj_u64 opaque[16];
} fj_tensor_map;

// One attention operand: [batch | varlen] x tokens x heads x dim, last dim contiguous.
typedef struct fj_tensor_ref {
  const void *ptr;
  fj_i64 batch_stride; // ignored for varlen (rows are addressed through cu_seqlens)
  fj_i64 row_stride;   // between consecutive tokens
  fj_i64 head_stride;
} fj_tensor_ref;

// Paged KV: pages [num_pages, page_size, heads_kv, dim] addressed through a block table.
typedef struct fj_paged_kv {
  const fj_i32 *block_table; // [batch, max_pages_per_seq]
  fj_i32 max_pages_per_seq;
  fj_i32 page_size;
  fj_i64 page_stride_k; // elements between pages of K (row/head strides come from k)
  fj_i64 page_stride_v;
} fj_paged_kv;

typedef struct fj_attention_params {
  fj_tensor_ref q, k, v, o;
  float *maybe_lse;                  // [batch, heads_q, seqlen_q] or varlen [heads_q, total_q]
  const fj_i32 *maybe_cu_seqlens_q;  // [batch + 1] prefix sums (varlen)
  const fj_i32 *maybe_cu_seqlens_k;  // [batch + 1] prefix sums (varlen)
  const fj_i32 *maybe_seqlens_k;     // [batch] per-sequence KV lengths (paged / decode)
  fj_paged_kv paged;
  fj_i32 batch;
  fj_i32 seqlen_q; // batch mode: every sequence; varlen: max
  fj_i32 seqlen_k;
  fj_i32 total_q;  // varlen: rows of the packed Q (LSE row count)
  fj_i32 heads_q;
  fj_i32 heads_kv;
  fj_i32 group;    // heads_q / heads_kv
  fj_i32 window_left;  // < 0: unbounded
  fj_i32 window_right; // < 0: unbounded
  float scale_log2;    // softmax scale * log2(e)
  float softcap;       // > 0: logits = softcap * tanh(logits * scale / softcap)
  float softcap_inv;   // 1 / softcap
  float scale;         // softmax scale (natural)
  // Split-K decode: partial outputs and their LSEs (float32), [splits, batch*heads_q*q_len, dv].
  float *maybe_partial_o;
  float *maybe_partial_lse;
  fj_i32 num_splits;
  fj_i32 num_m_blocks; // tiles along the query axis per (batch, head) in the launch grid
} fj_attention_params;

// Merge of partial attention states (O_i, LSE_i) into one (O, LSE).
typedef struct fj_combine_params {
  const float *partial_o;   // [num_states, rows, dv] float32
  const float *partial_lse; // [num_states, rows]
  fj_i64 state_stride_o;    // elements between states in partial_o
  fj_i64 state_stride_lse;
  void *o;                  // [rows, dv] in the output dtype, row stride below
  fj_i64 o_row_stride;
  float *maybe_lse;         // [rows]
  fj_i32 num_states;
  fj_i32 rows;
  fj_i32 head_dim_v;
  fj_i32 pad_;
} fj_combine_params;
