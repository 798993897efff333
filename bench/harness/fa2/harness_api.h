#pragma once
#include "kernel_params.h"
#include <cuda_runtime.h>
struct CfgInfo {
  const char *name;
  int dq, dv, bf16, causal, local, softcap, varlen, page, align, block_m, perf;
  void (*launch)(const fj_attention_params &, cudaStream_t);
};
