// Microbenchmark (docs/perf-notes.md, session 16): what an extra m64n8k16 RS wgmma (P against a ones
// tile, for row sums) costs next to each m64n128k16 RS wgmma of a P.V step. Two warpgroups per CTA,
// one CTA per SM, groups of 10 k-steps (a 160-key block), random bf16 operands. Not part of the
// build; on the GPU machine:
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Itemplates bench/microbench/wgmma_row_sum.cu
#include "prim/wgmma.cuh"
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>

using namespace fj;

constexpr int kSteps = 10;                       // k16 steps of one 160-key P.V block
constexpr int kThreads = 256;                    // two warpgroups, as the fa3 consumers
constexpr u32 kStepBytes = 16 * 128 * 2;         // one K-major B tile, 16 keys x 128 columns of bf16
constexpr u32 kOnesOffset = kSteps * kStepBytes; // the 16 x 8 ones tile of the row-sum wgmma
constexpr u32 kSmemBytes = kOnesOffset + 1024;
constexpr u32 kSmemWords = kSmemBytes / 4;
constexpr u32 kCoreMatrixBytes = 128; // 8 rows x 16 bytes, no swizzle
constexpr u32 kBf16OnesPair = 0x3f803f80u;

enum Mode { kPvOnly, kPvAndRowSum, kRowSumOnly };

template <Mode kMode>
__global__ void __launch_bounds__(kThreads, 1) bench(const u32 *init, float *out, int iters, long long *cycles) {
  extern __shared__ __align__(1024) u32 smem[];
  for (u32 i = threadIdx.x; i < kSmemWords; i += blockDim.x)
    smem[i] = init[i];
  __syncthreads();
  const u32 base = (u32)__cvta_generic_to_shared(smem);
  u32 p[kSteps][4]; // P's A fragments, as the fa3 consumer holds them
  for (int s = 0; s < kSteps; ++s)
    for (int j = 0; j < 4; ++j)
      p[s][j] = init[(threadIdx.x * 4 * kSteps + s * 4 + j) % kOnesOffset / 4];
  float o[64] = {}, row_sum[4] = {};
  const long long start = clock64();
  for (int it = 0; it < iters; ++it) {
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      if (kMode != kRowSumOnly)
        Wgmma<128, true, 0>::rs(o, p[s][0], p[s][1], p[s][2], p[s][3],
                                wgmma_desc(base + s * kStepBytes, kCoreMatrixBytes, 2 * kCoreMatrixBytes, 0), 1);
      if (kMode != kPvOnly)
        Wgmma<8, true, 0>::rs(row_sum, p[s][0], p[s][1], p[s][2], p[s][3],
                              wgmma_desc(base + kOnesOffset, kCoreMatrixBytes, 2 * kCoreMatrixBytes, 0), 1);
    }
    wgmma_commit_group();
    wgmma_wait_group<0>();
  }
  const long long stop = clock64();
  float sum = 0;
  for (float v : o)
    sum += v;
  for (float v : row_sum)
    sum += v;
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum; // keeps the wgmmas
  if (threadIdx.x == 0)
    cycles[blockIdx.x] = stop - start;
}

template <Mode kMode> static void run(const char *name, const u32 *init, float *out, long long *cycles, int sms) {
  constexpr int kIters = 20000, kWarmIters = 100;
  cudaFuncSetAttribute(bench<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  bench<kMode><<<sms, kThreads, kSmemBytes>>>(init, out, kWarmIters, cycles);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  bench<kMode><<<sms, kThreads, kSmemBytes>>>(init, out, kIters, cycles);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::vector<long long> c(sms);
  cudaMemcpy(c.data(), cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost);
  long long most = 0;
  for (long long v : c)
    most = v > most ? v : most;
  const double pv_flops = kMode == kRowSumOnly ? 0 : 2.0 * 64 * 128 * 16 * kSteps * 2 * sms * (double)kIters;
  printf("%-22s %8.1f cycles per group of %d steps (2 warpgroups) | %.3f ms | clock %.0f MHz | P.V TFLOP/s %.0f | %s\n",
         name, (double)most / kIters, kSteps, ms, most / (ms * 1e3), pv_flops / (ms * 1e-3) / 1e12,
         cudaGetErrorString(cudaGetLastError()));
}

int main() {
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  std::vector<u32> h(kSmemWords);
  u32 x = 1;
  for (u32 &v : h) { // bf16 pairs in [1, 2): random mantissas
    x = x * 1664525u + 1013904223u;
    v = (0x3f80u | ((x >> 9) & 0x7fu)) | (0x3f80u | ((x >> 20) & 0x7fu)) << 16;
  }
  for (u32 i = kOnesOffset / 4; i < kSmemWords; ++i)
    h[i] = kBf16OnesPair;
  u32 *init;
  float *out;
  long long *cycles;
  cudaMalloc(&init, kSmemBytes);
  cudaMalloc(&out, sms * kThreads * sizeof(float));
  cudaMalloc(&cycles, sms * sizeof(long long));
  cudaMemcpy(init, h.data(), kSmemBytes, cudaMemcpyHostToDevice);
  for (int rep = 0; rep < 2; ++rep) {
    run<kPvOnly>("n128 only", init, out, cycles, sms);
    run<kPvAndRowSum>("n128 + n8 (row sums)", init, out, cycles, sms);
    run<kRowSumOnly>("n8 only", init, out, cycles, sms);
  }
  return 0;
}
