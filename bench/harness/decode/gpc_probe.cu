// Which SMs share a GPC: thread-block clusters are placed inside one GPC, so SMs that host CTAs of
// one cluster are in the same GPC. One CTA per SM (large dynamic smem); union-find over many launches.
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>
#include <numeric>
#include <map>
#include <set>
#include <algorithm>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s (line %d)\n", #x, cudaGetErrorString(e), __LINE__); return 1; } } while (0)
__global__ void probe(int *out) {
  extern __shared__ char s[];
  unsigned smid, cid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(cid));
  if (threadIdx.x == 0) { s[0] = 1; out[2 * blockIdx.x] = (int)cid; out[2 * blockIdx.x + 1] = (int)smid; }
  long long t0 = clock64(); while (clock64() - t0 < 200000) {} // hold the SM so clusters spread
}
static int find(std::vector<int> &p, int x) { while (p[x] != x) x = p[x] = p[p[x]]; return x; }
int main() {
  int nsm; CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
  const int smem = 160 * 1024;
  CK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  int *d; CK(cudaMalloc(&d, 2 * 4096 * sizeof(int)));
  std::vector<int> parent(nsm); std::iota(parent.begin(), parent.end(), 0);
  std::vector<int> seen(nsm, 0);
  for (int cs : {16, 8, 4, 2}) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension; at[0].val.clusterDim.x = cs; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(128); cfg.dynamicSmemBytes = smem; cfg.attrs = at; cfg.numAttrs = 1;
    cfg.gridDim = dim3(cs);
    int maxc = 0; cudaError_t e = cudaOccupancyMaxActiveClusters(&maxc, probe, &cfg);
    printf("cluster size %2d: max active clusters %d (%s)\n", cs, maxc, cudaGetErrorString(e));
    if (maxc <= 0) continue;
    cfg.gridDim = dim3(cs * maxc);
    for (int rep = 0; rep < 64; ++rep) {
      CK(cudaLaunchKernelEx(&cfg, probe, d));
      CK(cudaDeviceSynchronize());
      std::vector<int> h(2 * cs * maxc);
      CK(cudaMemcpy(h.data(), d, h.size() * sizeof(int), cudaMemcpyDeviceToHost));
      for (int b = 0; b < cs * maxc; ++b) {
        int sm = h[2 * b + 1]; seen[sm] = 1;
        int first = h[2 * (b / cs * cs) + 1];
        parent[find(parent, sm)] = find(parent, first);
      }
    }
  }
  std::map<int, std::vector<int>> groups;
  for (int s = 0; s < nsm; ++s) groups[find(parent, s)].push_back(s);
  printf("%d SMs, %zu groups (GPCs as far as clusters reveal):\n", nsm, groups.size());
  std::vector<std::vector<int>> gs;
  for (auto &[k, v] : groups) gs.push_back(v);
  std::sort(gs.begin(), gs.end(), [](auto &a, auto &b) { return a.size() > b.size() || (a.size() == b.size() && a[0] < b[0]); });
  for (auto &v : gs) {
    printf("  %2zu SMs:", v.size());
    for (int s : v) printf(" %d", s);
    printf("\n");
  }
  return 0;
}
