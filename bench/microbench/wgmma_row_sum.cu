// Microbenchmark (docs/perf-notes.md, session 16): what an extra m64n8k16 RS wgmma (P against a ones tile, for row sums) costs next
// Build: nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Itemplates bench/microbench/wgmma_row_sum.cu
// to each m64n128k16 RS wgmma of a P.V step. Two warpgroups per CTA, one CTA per SM, 10 k-steps
// per group (a 160-key block), random operands.
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cuda_runtime.h>
#include "prim/wgmma.cuh"
using namespace fj;
constexpr int kSteps = 10;
template <int kMode> // 0: n128 only; 1: n128 + n8 per step; 2: n8 only
__global__ void __launch_bounds__(256, 1) bench(const uint32_t *init, float *out, int iters, long long *cycles) {
  extern __shared__ __align__(1024) uint32_t smem[];
  for (int i = threadIdx.x; i < 16384; i += blockDim.x) smem[i] = init[i];
  __syncthreads();
  const u32 base = (u32)__cvta_generic_to_shared(smem);
  u32 a[kSteps][4];
  for (int s = 0; s < kSteps; ++s) for (int j = 0; j < 4; ++j) a[s][j] = init[(threadIdx.x * 40 + s * 4 + j) % 16384];
  float acc[64] = {}, rsum[4] = {};
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      if (kMode != 2)
        Wgmma<128, true, 0>::rs(acc, a[s][0], a[s][1], a[s][2], a[s][3], wgmma_desc(base + s * 4096, 128, 256, 0), 1);
      if (kMode != 0)
        Wgmma<8, true, 0>::rs(rsum, a[s][0], a[s][1], a[s][2], a[s][3], wgmma_desc(base + 61440, 128, 256, 0), 1);
    }
    wgmma_commit_group();
    wgmma_wait_group<0>();
  }
  const long long t1 = clock64();
  float x = 0;
  for (int i = 0; i < 64; ++i) x += acc[i];
  for (int i = 0; i < 4; ++i) x += rsum[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = x;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}
template <int kMode> static void run(const char *name, const uint32_t *init, float *out, long long *cyc, int sms) {
  const int iters = 20000;
  cudaFuncSetAttribute(bench<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
  bench<kMode><<<sms, 256, 65536>>>(init, out, 100, cyc);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  cudaEventRecord(e0);
  bench<kMode><<<sms, 256, 65536>>>(init, out, iters, cyc);
  cudaEventRecord(e1); cudaEventSynchronize(e1);
  float ms; cudaEventElapsedTime(&ms, e0, e1);
  std::vector<long long> c(sms); cudaMemcpy(c.data(), cyc, sms * 8, cudaMemcpyDeviceToHost);
  long long mx = 0; for (auto v : c) mx = v > mx ? v : mx;
  const double per_group = (double)mx / iters; // cycles per 10-step group, both warpgroups sharing the SM
  const double flops_n128 = kMode == 2 ? 0 : 2.0 * 64 * 128 * 16 * kSteps * 2 * sms * (double)iters;
  printf("%-22s %8.1f cycles per group of %d steps (2 warpgroups) | %.3f ms | clock %.0f MHz | n128 TFLOP/s %.0f | %s\n", name,
         per_group, kSteps, ms, mx / (ms * 1e3), flops_n128 / (ms * 1e-3) / 1e12, cudaGetErrorString(cudaGetLastError()));
}
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  std::vector<uint32_t> h(16384); uint32_t x = 1;
  for (auto &v : h) { x = x * 1664525u + 1013904223u; const uint16_t lo = 0x3c00 | ((x >> 8) & 0x3ff), hi = 0x3c00 | ((x >> 20) & 0x3ff); v = lo | (uint32_t)hi << 16; }
  for (int i = 61440 / 4; i < 61440 / 4 + 64; ++i) h[i] = 0x3f803f80u; // bf16 ones (the n8 tile)
  uint32_t *init; float *out; long long *cyc;
  cudaMalloc(&init, 65536); cudaMalloc(&out, sms * 256 * 4); cudaMalloc(&cyc, sms * 8);
  cudaMemcpy(init, h.data(), 65536, cudaMemcpyHostToDevice);
  for (int rep = 0; rep < 2; ++rep) {
    run<0>("n128 only", init, out, cyc, sms);
    run<1>("n128 + n8 (row sums)", init, out, cyc, sms);
    run<2>("n8 only", init, out, cyc, sms);
  }
  return 0;
}
