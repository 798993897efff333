// setmaxnreg (sm_90a): moves register budget between warpgroups of one CTA. Every warp of the
// warpgroup executes it; it only takes effect when the kernel has a register cap at entry
// (__launch_bounds__(threads, 1)) and each role is one branch of a single if/else.
#pragma once

#include "prim/types.cuh"

namespace fj {

// setmaxnreg.inc.sync.aligned.u32 N: grow this warpgroup's per-thread register count to N.
template <int kRegs> __device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg range");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// setmaxnreg.dec.sync.aligned.u32 N: shrink this warpgroup's per-thread register count to N.
template <int kRegs> __device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg range");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

} // namespace fj
