// Standalone GPU harness for the fa3 kernel: one KernelConfig per binary (-include cfg_*.h).
// Correctness: fresh random inputs, NaN-poisoned O/LSE, every element vs a float64 reference;
// pass: max|ours - ref64| <= 2 * max|naive16 - ref64| + 1e-5 (naive16 = fp32 attention on the
// same 16-bit inputs, rounded to 16 bits). Perf: --perf S (B*S = 16384, H*d = 2048).
#include "compiler/planner.hpp"
#include "runtime/tma_desc.hpp"

#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace flashjit {
int64_t Plan::constant(const std::string &name, int64_t fallback) const {
  for (const PlanConstant &c : constants)
    if (c.name == name) return c.value;
  return fallback;
}
} // namespace flashjit
using namespace flashjit;
using C = KernelConfig;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); exit(2); } } while (0)

static uint16_t f2h(float f) { // round to nearest even, bf16 or fp16
  if (C::kDType == 1) { uint32_t u; memcpy(&u, &f, 4); if ((u & 0x7fffffff) > 0x7f800000) return 0x7fff; u += 0x7fff + ((u >> 16) & 1); return u >> 16; }
  __half_raw r = __float2half_rn(f); return r.x;
}
static float h2f(uint16_t h) {
  if (C::kDType == 1) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
  __half_raw r; r.x = h; return __half2float(r);
}
static double round16(double x) { return h2f(f2h((float)x)); }

struct Case {
  std::string name; int batch, hq, hkv; std::vector<int> sq, sk; int wl = -1, wr = -1; float softcap = 0.f;
};

static KernelSpec make_spec() {
  KernelSpec s; s.dtype = C::kDType ? FLASHJIT_BF16 : FLASHJIT_FP16; s.head_dim_qk = C::kHeadDimQK; s.head_dim_v = C::kHeadDimV;
  s.causal = C::kCausal; s.local = C::kLocal; s.softcap = C::kSoftcap; s.varlen = C::kVarlen; return s;
}

static bool wait_done(double seconds) {
  auto t0 = std::chrono::steady_clock::now();
  while (cudaStreamQuery(0) == cudaErrorNotReady) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

struct Run { std::vector<uint16_t> o; std::vector<float> lse; float ms = 0; };

// Launches on device buffers already filled; returns O and LSE.
static int g_sms = 0, g_l2 = 0;
static bool launch(const Case &c, const std::vector<uint16_t> &q, const std::vector<uint16_t> &k, const std::vector<uint16_t> &v,
                   int total_q, int total_k, Run *run, int timed_iters) {
  const KernelSpec spec = make_spec(); Plan plan; std::string why;
  if (!plan_fa3(spec, &plan, &why)) { printf("plan refused: %s\n", why.c_str()); return false; }
  plan.block_n = C::kBlockN; // A/B builds may override the tile
  plan.block_m = C::kBlockM;
  plan.cluster_m = C::kClusterM;
  for (PlanConstant &pc : plan.constants)
    if (pc.name == "kKVRowsPerCta") pc.value = C::kKVRowsPerCta;
  const int D = C::kHeadDimQK, DV = C::kHeadDimV;
  uint16_t *dq, *dk, *dv, *dout; float *dlse; int *dcq = nullptr, *dck = nullptr;
  CK(cudaMalloc(&dq, q.size() * 2)); CK(cudaMalloc(&dk, k.size() * 2)); CK(cudaMalloc(&dv, v.size() * 2));
  const int sq_max0 = *std::max_element(c.sq.begin(), c.sq.end());
  const size_t rows_q = C::kVarlen ? (size_t)total_q : (size_t)c.batch * sq_max0;
  const size_t o_elems = rows_q * c.hq * DV;
  CK(cudaMalloc(&dout, o_elems * 2)); CK(cudaMalloc(&dlse, rows_q * c.hq * 4));
  CK(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dk, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, v.data(), v.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(dout, 0xff, o_elems * 2)); CK(cudaMemset(dlse, 0xff, rows_q * c.hq * 4)); // NaN poison
  fj_fa3_params prm; memset(&prm, 0, sizeof prm);
  fj_attention_params &p = prm.base;
  const int sq_max = *std::max_element(c.sq.begin(), c.sq.end()), sk_max = *std::max_element(c.sk.begin(), c.sk.end());
  if (C::kVarlen) {
    std::vector<int> cq(c.batch + 1, 0), ckk(c.batch + 1, 0);
    for (int b = 0; b < c.batch; ++b) { cq[b + 1] = cq[b] + c.sq[b]; ckk[b + 1] = ckk[b] + c.sk[b]; }
    CK(cudaMalloc(&dcq, cq.size() * 4)); CK(cudaMalloc(&dck, ckk.size() * 4));
    CK(cudaMemcpy(dcq, cq.data(), cq.size() * 4, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dck, ckk.data(), ckk.size() * 4, cudaMemcpyHostToDevice));
    p.maybe_cu_seqlens_q = dcq; p.maybe_cu_seqlens_k = dck;
  }
  p.q = {dq, (long long)sq_max * c.hq * D, (long long)c.hq * D, D};
  p.k = {dk, (long long)sk_max * c.hkv * D, (long long)c.hkv * D, D};
  p.v = {dv, (long long)sk_max * c.hkv * DV, (long long)c.hkv * DV, DV};
  p.o = {dout, (long long)sq_max * c.hq * DV, (long long)c.hq * DV, DV};
  p.maybe_lse = dlse; p.batch = c.batch; p.seqlen_q = sq_max; p.seqlen_k = sk_max; p.total_q = total_q;
  p.heads_q = c.hq; p.heads_kv = c.hkv; p.group = c.hq / c.hkv; p.window_left = c.wl; p.window_right = c.wr;
  p.scale = 1.0f / std::sqrt((float)D); p.scale_log2 = p.scale * 1.4426950408889634f;
  p.softcap = c.softcap; p.softcap_inv = c.softcap > 0 ? 1.0f / c.softcap : 0.f;
  if (!fa3_encode_tensor_maps(spec, plan, total_k, cuTensorMapEncodeTiled, &prm, &why)) { printf("encode failed: %s\n", why.c_str()); return false; }
  const int grid = fa3_fill_schedule(spec, plan, g_sms, g_l2, &prm);
  CK(cudaFuncSetAttribute(fj_fa3_prefill, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
  // CTA pairs (kClusterM = 2) need the cluster launch attribute, as runtime/launch_fa3.cpp passes it.
  cudaLaunchAttribute cluster_attr{};
  cluster_attr.id = cudaLaunchAttributeClusterDimension;
  cluster_attr.val.clusterDim.x = C::kClusterM; cluster_attr.val.clusterDim.y = 1; cluster_attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t lc{};
  lc.gridDim = dim3(grid); lc.blockDim = dim3(C::kThreads); lc.dynamicSmemBytes = C::kSmemBytes;
  lc.attrs = &cluster_attr; lc.numAttrs = 1;
  auto fj_launch = [&]() { CK(cudaLaunchKernelEx(&lc, fj_fa3_prefill, prm)); };
  if (timed_iters > 0) {
    int clusters = 0;
    CK(cudaOccupancyMaxActiveClusters(&clusters, fj_fa3_prefill, &lc));
    printf("   grid %d CTAs, clusters of %d, at most %d clusters resident\n", grid, C::kClusterM, clusters);
  }
  fj_launch();
  CK(cudaGetLastError());
  if (!wait_done(10.0)) { printf("HANG (kernel did not finish in 10 s)\n"); fflush(stdout); _exit(3); }
  CK(cudaDeviceSynchronize());
  if (timed_iters > 0) {
    for (int i = 0; i < 5; ++i) fj_launch();
    CK(cudaDeviceSynchronize());
    std::vector<float> times; cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (int i = 0; i < timed_iters; ++i) {
      cudaEventRecord(e0); fj_launch(); cudaEventRecord(e1);
      cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); times.push_back(ms);
    }
    std::sort(times.begin(), times.end()); run->ms = times[times.size() / 2];
  }
  run->o.resize(o_elems); run->lse.resize(rows_q * c.hq);
  CK(cudaMemcpy(run->o.data(), dout, o_elems * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(run->lse.data(), dlse, run->lse.size() * 4, cudaMemcpyDeviceToHost));
  cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(dlse); if (dcq) { cudaFree(dcq); cudaFree(dck); }
  return true;
}

static bool check_case(const Case &c, std::mt19937 &rng) {
  const int D = C::kHeadDimQK, DV = C::kHeadDimV;
  const int sq_max = *std::max_element(c.sq.begin(), c.sq.end()), sk_max = *std::max_element(c.sk.begin(), c.sk.end());
  // Row r of sequence b in the buffers (batch mode: [B, S_max, H, D]; varlen: packed).
  std::vector<int> q0(c.batch), k0(c.batch); int tq = 0, tk = 0;
  for (int b = 0; b < c.batch; ++b) { q0[b] = C::kVarlen ? tq : b * sq_max; k0[b] = C::kVarlen ? tk : b * sk_max; tq += c.sq[b]; tk += c.sk[b]; }
  const int rows_q = C::kVarlen ? tq : c.batch * sq_max, rows_k = C::kVarlen ? tk : c.batch * sk_max;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> q((size_t)rows_q * c.hq * D), k((size_t)rows_k * c.hkv * D), v((size_t)rows_k * c.hkv * DV);
  const float qk_amp = c.softcap > 0 ? 3.0f : 1.0f; // larger logits so the cap bites
  for (auto &x : q) x = f2h(nd(rng) * qk_amp); for (auto &x : k) x = f2h(nd(rng)); for (auto &x : v) x = f2h(nd(rng));
  Run run;
  if (!launch(c, q, k, v, C::kVarlen ? tq : sq_max, C::kVarlen ? tk : sk_max, &run, 0)) return false;
  const double scale = 1.0 / std::sqrt((double)D);
  double max_err = 0, naive_err = 0, lse_err = 0; long bad_zero = 0, nan_count = 0, empty_rows = 0;
  std::vector<std::thread> pool; std::vector<double> e1(c.batch * c.hq), e2(c.batch * c.hq), e3(c.batch * c.hq);
  std::vector<long> z1(c.batch * c.hq), z2(c.batch * c.hq), z3(c.batch * c.hq);
  auto work = [&](int bh) {
    const int b = bh / c.hq, h = bh % c.hq, hk = h / (c.hq / c.hkv);
    const int sq = c.sq[b], sk = c.sk[b], off = sk - sq;
    std::vector<double> s(sk), o(DV); std::vector<float> sf(sk), of(DV);
    double me = 0, ne = 0, le = 0; long bz = 0, nn = 0, er = 0;
    for (int i = 0; i < sq; ++i) {
      const uint16_t *qi = &q[((size_t)(q0[b] + i) * c.hq + h) * D];
      double m = -INFINITY; float mf = -INFINITY;
      for (int j = 0; j < sk; ++j) {
        bool vis = true;
        if (C::kCausal && j > i + off) vis = false;
        if (C::kLocal && c.wr >= 0 && j > i + off + c.wr) vis = false;
        if (C::kLocal && c.wl >= 0 && j < i + off - c.wl) vis = false;
        if (!vis) { s[j] = -INFINITY; sf[j] = -INFINITY; continue; }
        const uint16_t *kj = &k[((size_t)(k0[b] + j) * c.hkv + hk) * D];
        double acc = 0; float accf = 0;
        for (int d = 0; d < D; ++d) { double a = h2f(qi[d]), bb = h2f(kj[d]); acc += a * bb; accf += (float)a * (float)bb; }
        acc *= scale; float sff = accf * (float)scale;
        if (c.softcap > 0) { acc = c.softcap * std::tanh(acc / c.softcap); sff = c.softcap * std::tanh(sff / c.softcap); }
        s[j] = acc; sf[j] = sff; m = std::max(m, acc); mf = std::max(mf, sff);
      }
      std::fill(o.begin(), o.end(), 0.0); std::fill(of.begin(), of.end(), 0.f);
      double l = 0; float lf = 0;
      if (m > -INFINITY) for (int j = 0; j < sk; ++j) {
        if (s[j] == -INFINITY) continue;
        const double pj = std::exp(s[j] - m); const float pf = std::exp(sf[j] - mf); l += pj; lf += pf;
        const uint16_t *vj = &v[((size_t)(k0[b] + j) * c.hkv + hk) * DV];
        for (int d = 0; d < DV; ++d) { o[d] += pj * h2f(vj[d]); of[d] += pf * h2f(vj[d]); }
      }
      const double lse_ref = l > 0 ? m + std::log(l) : -INFINITY;
      const size_t orow = ((size_t)(q0[b] + i) * c.hq + h) * DV;
      for (int d = 0; d < DV; ++d) {
        const double ref = l > 0 ? o[d] / l : 0.0, naive = lf > 0 ? round16(of[d] / lf) : 0.0;
        const double ours = h2f(run.o[orow + d]);
        if (std::isnan(ours)) ++nn;
        me = std::max(me, std::isnan(ours) ? INFINITY : std::fabs(ours - ref)); ne = std::max(ne, std::fabs(naive - ref));
        if (l == 0 && ours != 0.0) ++bz;
      }
      const size_t li = C::kVarlen ? (size_t)h * tq + q0[b] + i : ((size_t)b * c.hq + h) * sq_max + i;
      const float lo = run.lse[li];
      if (l == 0) { ++er; if (!(std::isinf(lo) && lo < 0)) ++bz; }
      else le = std::max(le, std::isnan(lo) ? INFINITY : std::fabs(lo - lse_ref));
    }
    e1[bh] = me; e2[bh] = ne; e3[bh] = le; z1[bh] = bz; z2[bh] = nn; z3[bh] = er;
  };
  const int nthreads = std::max(1u, std::thread::hardware_concurrency());
  for (int t = 0; t < nthreads; ++t) pool.emplace_back([&, t] { for (int bh = t; bh < c.batch * c.hq; bh += nthreads) work(bh); });
  for (auto &t : pool) t.join();
  for (int i = 0; i < c.batch * c.hq; ++i) { max_err = std::max(max_err, e1[i]); naive_err = std::max(naive_err, e2[i]); lse_err = std::max(lse_err, e3[i]); bad_zero += z1[i]; nan_count += z2[i]; empty_rows += z3[i]; }
  const double bound = 2 * naive_err + 1e-5;
  const bool ok = max_err <= bound && lse_err <= 2e-3 && bad_zero == 0 && nan_count == 0;
  printf("%-34s max_err=%.3e naive=%.3e bound=%.3e lse_err=%.2e empty_rows=%ld bad_empty=%ld nan=%ld  %s\n", c.name.c_str(), max_err,
         naive_err, bound, lse_err, empty_rows, bad_zero, nan_count, ok ? "PASS" : "FAIL");
  fflush(stdout);
  return ok;
}

int main(int argc, char **argv) {
  cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0)); g_sms = prop.multiProcessorCount; g_l2 = prop.l2CacheSize;
  cuInit(0);
  const KernelSpec spec = make_spec(); Plan plan; std::string why; plan_fa3(spec, &plan, &why);
  printf("== fa3 d%d/v%d %s causal=%d local=%d softcap=%d varlen=%d  M=%d N=%d pingpong=%d smem=%d\n", C::kHeadDimQK, C::kHeadDimV,
         C::kDType ? "bf16" : "fp16", C::kCausal, C::kLocal, C::kSoftcap, C::kVarlen, C::kBlockM, C::kBlockN, (int)C::kPingpong, C::kSmemBytes);
  printf("   exp2_poly_every=%d cluster_m=%d\n", C::kExp2PolyEvery, C::kClusterM);
  if (argc >= 3 && std::string(argv[1]) == "--perf") {
    for (int a = 2; a < argc; ++a) {
      const int S = atoi(argv[a]); const int B = std::max(1, 16384 / S), H = 2048 / C::kHeadDimQK;
      Case c{"perf", B, H, H, std::vector<int>(B, S), std::vector<int>(B, S)};
      std::mt19937 rng(7); std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<uint16_t> q((size_t)B * S * H * C::kHeadDimQK), k(q.size()), v((size_t)B * S * H * C::kHeadDimV);
      for (auto &x : q) x = f2h(nd(rng)); for (auto &x : k) x = f2h(nd(rng)); for (auto &x : v) x = f2h(nd(rng));
      Run run; if (!launch(c, q, k, v, S, S, &run, 30)) return 1;
      long nans = 0; for (auto x : run.o) nans += std::isnan(h2f(x));
      double flops = 2.0 * B * H * (double)S * S * (C::kHeadDimQK + C::kHeadDimV); if (C::kCausal) flops /= 2;
      printf("PERF d%d/v%d %s causal=%d B=%d H=%d S=%d: %.3f ms  %.1f TFLOP/s  (nan=%ld)\n", C::kHeadDimQK, C::kHeadDimV, C::kDType ? "bf16" : "fp16",
             (int)C::kCausal, B, H, S, run.ms, flops / run.ms / 1e9, nans);
      fflush(stdout);
    }
    return 0;
  }
  std::mt19937 rng(1234 + C::kHeadDimQK);
  std::vector<Case> cases;
  const float cap = C::kSoftcap ? 20.f : 0.f;
  if (!C::kVarlen) {
    cases.push_back({"b2 h4/2 sq300 sk477", 2, 4, 2, {300, 300}, {477, 477}, 80, 40, cap});
    cases.push_back({"b1 h2/2 sq256 sk352 (exact)", 1, 2, 2, {256, 256}, {352, 352}, 100, 0, cap});
    cases.push_back({"b2 h3/1 sq477 sk300 (MQA)", 2, 3, 1, {477, 477}, {300, 300}, 30, 60, cap});
    cases.push_back({"b1 h2/2 sq1 sk700", 1, 2, 2, {1}, {700}, 200, 0, cap});
    cases.push_back({"b1 h2/1 sq1100 sk1100", 1, 2, 1, {1100}, {1100}, 257, 3, cap});
  } else {
    cases.push_back({"varlen b4 h4/2", 4, 4, 2, {100, 300, 1, 257}, {200, 150, 450, 257}, 64, 16, cap});
    cases.push_back({"varlen b3 h2/2 long", 3, 2, 2, {700, 129, 64}, {500, 900, 63}, 150, 10, cap});
  }
  int fails = 0;
  for (const Case &c : cases) fails += !check_case(c, rng);
  printf("RESULT %s\n", fails ? "FAIL" : "ALL PASS");
  return fails ? 1 : 0;
}
