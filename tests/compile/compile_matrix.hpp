// Shared pieces of the compile tests: building a spec's kernel through the real pipeline (plan ->
// generated source -> NVRTC -> cubin) and reading its SASS with cuobjdump.
#pragma once

#include "compiler/build.hpp"
#include "compiler/planner.hpp"

#include <gtest/gtest.h>

#include <string>

namespace flashjit::testing {

inline KernelSpec prefill_spec(Arch arch, int dqk, int dv, flashjit_dtype dtype, bool causal) {
  KernelSpec spec;
  spec.arch = arch;
  spec.head_dim_qk = dqk;
  spec.head_dim_v = dv;
  spec.dtype = dtype;
  spec.causal = causal;
  return spec;
}

inline KernelSpec decode_spec(Arch arch, int dim, flashjit_dtype dtype, int group, int q_len, int page_size = 0) {
  KernelSpec spec;
  spec.op = Op::decode;
  spec.arch = arch;
  spec.head_dim_qk = dim;
  spec.head_dim_v = dim;
  spec.dtype = dtype;
  spec.gqa_group = group;
  spec.q_len = q_len;
  spec.page_size = page_size;
  return spec;
}

// Compiles `spec` with `variant` forced; fails the test with NVRTC's log otherwise.
inline CompiledKernel compile_or_fail(const KernelSpec &spec, Variant variant) {
  PlanChoice choice = choose_plan(spec, variant);
  EXPECT_TRUE(choice.ok) << choice.error;
  CompiledKernel kernel;
  if (!choice.ok)
    return kernel;
  Status s = build_kernel(choice.spec, choice.plan, FLASHJIT_BACKEND_NVRTC, &kernel);
  EXPECT_TRUE(s.ok()) << s.message;
  return kernel;
}

// Path of cuobjdump: the toolkit's, else the one PyPI's nvidia-cuda-cuobjdump installs; "" if none.
std::string find_cuobjdump();

// SASS of a cubin (cuobjdump --dump-sass), or "" with *error set.
std::string dump_sass(const std::vector<char> &cubin, std::string *error);

// How many times `what` occurs in `text` (PTX or SASS), overlaps included.
size_t count_of(const std::string &text, const std::string &what);

} // namespace flashjit::testing
