// What the read microbenchmarks share: the error check of main and a 16-byte read-only load.
#pragma once

#include "prim/ld_global.cuh"
#include <cstdio>
#include <cuda_runtime.h>

// A failed CUDA runtime call prints itself and ends main.
#define CHECK(call)                                                                                                    \
  do {                                                                                                                 \
    cudaError_t e = (call);                                                                                            \
    if (e != cudaSuccess) {                                                                                            \
      std::printf("%s: %s\n", #call, cudaGetErrorString(e));                                                           \
      return 1;                                                                                                        \
    }                                                                                                                  \
  } while (0)

// One 16-byte vector through the read-only path (L1 bypassed as decode's K/V loads), as a uint4.
__device__ __forceinline__ uint4 ld_global_nc_v4(const void *address) {
  fj::i32 words[4];
  fj::ld_global_nc_v4_s32(words, address);
  return make_uint4(words[0], words[1], words[2], words[3]);
}
