// A CPU model of the fa3 kernel's arithmetic (templates/kernels/fa3/softmax.cuh, epilogue.cuh), row
// by row, for questions of precision that need no GPU: fp32 logits; the row's key blocks walked from
// the last down, as the kernel walks a tile; the running max in raw logits with exp2 and the scale
// folded in (p = 2^(s*c - m*c)); eager rescaling, or lazy (the max moves only by more than 2^8) with
// or without the top rounding; P rounded to the 16-bit dtype before P.V, the sum from the unrounded p;
// O rounded to the dtype. On run 29j's failing case it gives the H200's max errors (the unit test pins
// them). Not modeled: the order of the tensor cores' fp32 sums, the exp2 polynomial columns (small
// head dims), the tail split's merge.
#pragma once

#include "tests/reference/reference.hpp"

#include <span>

namespace flashjit::ref {

struct Fa3Numerics {
  int block_n = 128;              // keys per block; blocks start at multiples of it
  bool lazy_rescale = false;      // kLazyRescale
  bool lazy_top_rounding = false; // kLazyTopRounding (with lazy_rescale)
};

// O rounded to `dtype` ([total_q, heads_q, head_dim_v]) and the LSE ([heads_q, total_q], natural log)
// as the fa3 kernel computes them. No masks other than causal / window; no softcap.
Output fa3_numerics_attention(const Problem &problem, std::span<const float> q, std::span<const float> k,
                              std::span<const float> v, Dtype dtype, const Fa3Numerics &numerics);

} // namespace flashjit::ref
