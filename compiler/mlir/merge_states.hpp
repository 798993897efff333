// Warp-wide merge of partial attention states of one row, shared by the combine kernel
// (gen_combine.cpp, where it is defined) and the split-K decode's fj_decode_combine (gen_decode.cpp),
// as templates/kernels/combine.cuh's merge_states_row is by their NVRTC counterparts.
#pragma once

#include "compiler/mlir/emit.hpp"

namespace flashjit::mlirgen {

struct RowMerge {
  DType dtype;
  int head_dim_v;
  bool aligned16;
  // The states were written by other CTAs of the running grid (the decode's fused merge): load
  // them through L2 (ld.global.cg), not the read-only path (combine.cuh's ld_state_f32).
  bool coherent = false;
};

// Merges `count` states of one row: O states at o_states + i * o_stride (fp32, i64 stride), LSEs at
// lse_states + i * lse_stride; writes head_dim_v 16-bit outputs at out_row and, when maybe_lse is
// not null, the merged LSE at maybe_lse[lse_index] (i64).
void merge_states_row(Emitter &e, const RowMerge &m, mlir::Value o_states, mlir::Value o_stride, mlir::Value lse_states,
                      mlir::Value lse_stride, mlir::Value count, mlir::Value out_row, mlir::Value maybe_lse,
                      mlir::Value lse_index);

} // namespace flashjit::mlirgen
