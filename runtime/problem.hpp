// A validated problem with every default filled in (strides, head_dim_v, scale), and the
// KernelSpec it maps to. Validation runs on the host only: it reads no device memory.
#pragma once

#include "compiler/spec.hpp"

#include <flashjit/flashjit.hpp>

namespace flashjit {

struct NormalizedProblem {
  flashjit_problem p{}; // strides, head_dim_v and scale resolved
  bool varlen = false;
  bool paged = false;
  int group = 1;        // heads_q / heads_kv
  int align_bytes = 16; // 16 if every row start is 16-byte aligned, else 2
  bool empty = false;   // nothing to compute (zero query rows)
};

// A tensor whose elements reach further than this from its pointer cannot be in device memory (the
// GPU's virtual address space has 49 bits); below it, every offset the kernels form, in elements or
// bytes, fits in int64.
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 49;

// Whether `count` blocks of `block` elements, `stride` elements apart (count >= 1, stride >= 0),
// stay within kMaxTensorBytes of their pointer; computed without overflow.
bool fits_in_device_memory(int64_t count, int64_t stride, int64_t block, int element_bytes);

// Checks every field; on failure the message names the parameter and what was expected, and *out
// holds a partly normalized problem that must not be used.
Status validate_problem(const flashjit_problem *problem, NormalizedProblem *out);

// Longest query length the decode kernel serves (speculative-decoding verification uses 2-8).
inline constexpr int kMaxDecodeQueryLength = 16;

// The spec for a validated problem on `arch`: decode for short batch-mode queries, else prefill.
// `backend` is the runtime's: the decode key block depends on whether it renders TMA tiles.
KernelSpec spec_for_problem(const NormalizedProblem &problem, const Arch &arch,
                            flashjit_backend backend = FLASHJIT_BACKEND_AUTO);

} // namespace flashjit
