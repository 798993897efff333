// GPU harness for the split-K decode + combine: correctness against a float64 CPU reference, and
// KV-read bandwidth. Loads cubins compiled here by gen (NVRTC, templates from memory), launches
// through the driver API, schedules with compiler/splitk_schedule.
//   harness <cubin dir> [check [PREFIX]|perf|all|ab]   (PREFIX: see main's check)
// ab: the schedule balanced by keys (the default) against the tile-balanced one of runs 1-9 and
// against keys without the piece charge, in one process on the same data: each first checked
// against float64 with NaN-poisoned outputs, then timed interleaved (compiler/splitk_schedule.hpp).
#include "compiler/splitk_schedule.hpp"
#include "params_decode.h"
#include "params_fa3.h"

#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace flashjit;

#define CK(x)                                                                                                          \
  do {                                                                                                                 \
    CUresult r_ = (x);                                                                                                 \
    if (r_ != CUDA_SUCCESS) {                                                                                          \
      const char *s_ = nullptr;                                                                                        \
      cuGetErrorString(r_, &s_);                                                                                       \
      fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?");                                      \
      exit(2);                                                                                                         \
    }                                                                                                                  \
  } while (0)

// ---- 16-bit conversions (host) ----
static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t r = 0x7fff + ((u >> 16) & 1);
  return (uint16_t)((u + r) >> 16);
}
static float bf2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t f2h(float f) {
  // round-to-nearest-even float -> half (normal range + subnormals; inputs here are small)
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int exp = ((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff)
    return sign | 0x7c00 | (mant ? 0x200 : 0);
  if (exp >= 31)
    return sign | 0x7c00;
  if (exp <= 0) {
    if (exp < -10)
      return sign;
    mant |= 0x800000;
    int shift = 14 - exp;
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1)))
      ++half;
    return sign | half;
  }
  uint32_t half = sign | (exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1)))
    ++half;
  return half;
}
static float h2f(uint16_t h) {
  uint32_t sign = (h & 0x8000) << 16;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0)
      u = sign;
    else {
      exp = 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      u = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    }
  } else if (exp == 31)
    u = sign | 0x7f800000 | (mant << 13);
  else
    u = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  float f;
  memcpy(&f, &u, 4);
  return f;
}
struct DT {
  bool bf;
  uint16_t to(float f) const { return bf ? f2bf(f) : f2h(f); }
  float from(uint16_t b) const { return bf ? bf2f(b) : h2f(b); }
  float round(float f) const { return from(to(f)); }
};

// ---- kernels ----
struct Kernel {
  CUmodule mod;
  CUfunction decode, combine, merge;
  std::map<std::string, long> c;
};
static std::map<std::string, std::string> g_index;
static std::string g_dir;

static Kernel load_kernel(const std::string &tag) {
  Kernel k;
  auto it = g_index.find(tag);
  if (it == g_index.end()) {
    fprintf(stderr, "no cubin for %s\n", tag.c_str());
    exit(2);
  }
  std::ifstream f(g_dir + "/" + it->second + ".cubin", std::ios::binary);
  std::vector<char> bin((std::istreambuf_iterator<char>(f)), {});
  CK(cuModuleLoadData(&k.mod, bin.data()));
  CK(cuModuleGetFunction(&k.decode, k.mod, "fj_decode_splitk"));
  CK(cuModuleGetFunction(&k.combine, k.mod, "fj_decode_combine"));
  CK(cuModuleGetFunction(&k.merge, k.mod, "fj_combine"));
  std::ifstream m(g_dir + "/" + it->second + ".meta");
  std::string name;
  long v;
  while (m >> name >> v)
    k.c[name] = v;
  CK(cuFuncSetAttribute(k.decode, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)k.c["smem"]));
  return k;
}

struct Dev {
  CUdeviceptr p = 0;
  size_t n = 0;
  void alloc(size_t bytes) {
    n = bytes;
    CK(cuMemAlloc(&p, std::max<size_t>(bytes, 16)));
  }
  void up(const void *h, size_t bytes) { CK(cuMemcpyHtoD(p, h, bytes)); }
  void down(void *h, size_t bytes) const { CK(cuMemcpyDtoH(h, p, bytes)); }
  void free() {
    if (p)
      cuMemFree(p);
    p = 0;
  }
};

static int g_sms = 132;

// ---- one decode problem ----
struct Case {
  std::string name, tag;
  bool bf = true;
  int dqk = 128, dv = 128, group = 4, q_len = 1, page = 0;
  bool causal = false, local = false, softcap = false;
  int wl = -1, wr = -1;
  float cap = 0;
  int heads_kv = 2;
  std::vector<int> lens;
  int row_pad = 0;        // extra elements per K/V/Q row (unaligned strides when odd)
  uint64_t seed = 0;      // 0: from the name
  bool fast_fill = false; // logical K/V from an LCG (long sequences); storage no key maps to stays NaN
};

struct Problem {
  Case c;
  int batch, hq, max_len, max_pages, num_pages;
  std::vector<uint16_t> q, k, v; // logical: q [b, q_len, hq, dqk] with row pad; k/v layout below
  std::vector<int> table;
  // K/V storage: paged: [num_pages, page, hkv, d(+pad)], contiguous: [b, max_len, hkv, d(+pad)]
  long k_row, k_head, k_page_or_batch, v_row, v_head, v_page_or_batch, q_row, q_head, q_batch;
};

static uint16_t kv_at(const Problem &P, const std::vector<uint16_t> &buf, bool is_k, int b, int j, int h, int d) {
  long row = is_k ? P.k_row : P.v_row, head = is_k ? P.k_head : P.v_head,
       pb = is_k ? P.k_page_or_batch : P.v_page_or_batch;
  if (P.c.page > 0) {
    int page = P.table[b * P.max_pages + j / P.c.page];
    return buf[page * pb + (j % P.c.page) * row + h * head + d];
  }
  return buf[b * pb + (long)j * row + h * head + d];
}

static Problem make_problem(const Case &c, uint64_t seed) {
  Problem P;
  P.c = c;
  DT dt{c.bf};
  P.batch = (int)c.lens.size();
  P.hq = c.heads_kv * c.group;
  P.max_len = std::max(1, *std::max_element(c.lens.begin(), c.lens.end()));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> U(-1.f, 1.f);
  int dq = c.dqk + c.row_pad, dvv = c.dv + c.row_pad;
  P.q_head = dq;
  P.q_row = (long)P.hq * dq;
  P.q_batch = (long)c.q_len * P.q_row;
  constexpr uint16_t kNaN = 0x7fff; // storage no key maps to: reading it would poison O
  P.q.assign(P.batch * P.q_batch, kNaN);
  for (int b = 0; b < P.batch; ++b)
    for (int i = 0; i < c.q_len; ++i)
      for (int h = 0; h < P.hq; ++h)
        for (int d = 0; d < c.dqk; ++d)
          P.q[b * P.q_batch + i * P.q_row + h * P.q_head + d] = dt.to(U(rng));
  P.k_head = dq;
  P.k_row = (long)c.heads_kv * dq;
  P.v_head = dvv;
  P.v_row = (long)c.heads_kv * dvv;
  if (c.page > 0) {
    P.max_pages = (P.max_len + c.page - 1) / c.page;
    P.num_pages = P.batch * P.max_pages + 3; // a few unused pages
    std::vector<int> perm(P.num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    // FJ_HARNESS_ORDERED_PAGES=1: the block table in page order (a diagnostic of how the page
    // pool's order costs); otherwise shuffled.
    const char *ordered = getenv("FJ_HARNESS_ORDERED_PAGES");
    if (ordered == nullptr || ordered[0] != '1') {
      std::mt19937_64 shuffle_rng(seed ^ 0x5eed);
      std::shuffle(perm.begin(), perm.end(), shuffle_rng);
    }
    P.table.assign(P.batch * P.max_pages, 0);
    for (int i = 0; i < P.batch * P.max_pages; ++i)
      P.table[i] = perm[i];
    P.k_page_or_batch = c.page * P.k_row;
    P.v_page_or_batch = c.page * P.v_row;
    P.k.assign(P.num_pages * P.k_page_or_batch, kNaN);
    P.v.assign(P.num_pages * P.v_page_or_batch, kNaN);
  } else {
    P.max_pages = 0;
    P.k_page_or_batch = P.max_len * P.k_row;
    P.v_page_or_batch = P.max_len * P.v_row;
    P.k.assign(P.batch * P.k_page_or_batch, kNaN);
    P.v.assign(P.batch * P.v_page_or_batch, kNaN);
  }
  if (c.name == "perf") { // timing only: any finite values, filled fast
    uint32_t x = 12345;
    for (auto *buf : {&P.k, &P.v})
      for (auto &e : *buf) {
        x = x * 1664525u + 1013904223u;
        e = dt.to(((x >> 9) & 0xffff) / 32768.f - 1.f);
      }
    return P;
  }
  // Logical K/V values in (b, j, h, d) order, so paged and contiguous layouts hold the same data.
  uint32_t lcg = static_cast<uint32_t>(seed);
  auto value = [&]() {
    if (!c.fast_fill)
      return U(rng);
    lcg = lcg * 1664525u + 1013904223u;
    return ((lcg >> 9) & 0xffff) / 32768.f - 1.f;
  };
  for (int b = 0; b < P.batch; ++b)
    for (int j = 0; j < c.lens[b]; ++j)
      for (int h = 0; h < c.heads_kv; ++h) {
        for (int d = 0; d < c.dqk; ++d) {
          long at = c.page > 0 ? P.table[b * P.max_pages + j / c.page] * P.k_page_or_batch + (j % c.page) * P.k_row
                               : b * P.k_page_or_batch + (long)j * P.k_row;
          P.k[at + h * P.k_head + d] = dt.to(value());
        }
        for (int d = 0; d < c.dv; ++d) {
          long at = c.page > 0 ? P.table[b * P.max_pages + j / c.page] * P.v_page_or_batch + (j % c.page) * P.v_row
                               : b * P.v_page_or_batch + (long)j * P.v_row;
          P.v[at + h * P.v_head + d] = dt.to(value());
        }
      }
  return P;
}

// float64 reference and the naive low-precision one (fp32 math, P and O rounded to 16 bits).
static void reference(const Problem &P, std::vector<double> &o64, std::vector<double> &lse64, std::vector<float> &olp) {
  const Case &c = P.c;
  DT dt{c.bf};
  double scale = 1.0 / std::sqrt((double)c.dqk);
  o64.assign((size_t)P.batch * c.q_len * P.hq * c.dv, 0);
  lse64.assign((size_t)P.batch * P.hq * c.q_len, -INFINITY);
  olp.assign(o64.size(), 0);
  int jobs = P.batch * P.hq * c.q_len;
  auto work = [&](int t0, int stride) {
    std::vector<double> s(P.max_len);
    std::vector<float> sf(P.max_len);
    for (int t = t0; t < jobs; t += stride) {
      int b = t / (P.hq * c.q_len), h = (t / c.q_len) % P.hq, i = t % c.q_len;
      int hk = h / c.group, L = c.lens[b];
      int diag = i + L - c.q_len;
      double mx = -INFINITY;
      float mxf = -INFINITY;
      std::vector<int> vis;
      for (int j = 0; j < L; ++j) {
        bool ok = true;
        if (c.causal && j > diag)
          ok = false;
        if (c.local && c.wl >= 0 && j < diag - c.wl)
          ok = false;
        if (c.local && c.wr >= 0 && j > diag + c.wr)
          ok = false;
        if (!ok)
          continue;
        double acc = 0;
        float accf = 0;
        for (int d = 0; d < c.dqk; ++d) {
          double qv = dt.from(P.q[b * P.q_batch + i * P.q_row + h * P.q_head + d]);
          double kv = dt.from(kv_at(P, P.k, true, b, j, hk, d));
          acc += qv * kv;
          accf += (float)qv * (float)kv;
        }
        double x = acc * scale;
        float xf = accf * (float)scale;
        if (c.softcap) {
          x = c.cap * std::tanh(x / c.cap);
          xf = c.cap * std::tanh(xf / c.cap);
        }
        s[j] = x;
        sf[j] = xf;
        vis.push_back(j);
        mx = std::max(mx, x);
        mxf = std::max(mxf, xf);
      }
      size_t obase = (((size_t)b * c.q_len + i) * P.hq + h) * c.dv;
      if (vis.empty())
        continue; // O = 0, LSE = -inf
      double sum = 0;
      float sumf = 0;
      for (int j : vis) {
        sum += std::exp(s[j] - mx);
        sumf += std::exp(sf[j] - mxf);
      }
      lse64[((size_t)b * P.hq + h) * c.q_len + i] = mx + std::log(sum);
      std::vector<double> acc(c.dv, 0);
      std::vector<float> accf(c.dv, 0);
      for (int j : vis) {
        double p = std::exp(s[j] - mx) / sum;
        float pf = dt.round(std::exp(sf[j] - mxf)); // unnormalized P rounded to 16 bits, as FA does
        for (int d = 0; d < c.dv; ++d) {
          double vv = dt.from(kv_at(P, P.v, false, b, j, hk, d));
          acc[d] += p * vv;
          accf[d] += pf * (float)vv;
        }
      }
      for (int d = 0; d < c.dv; ++d) {
        o64[obase + d] = acc[d];
        olp[obase + d] = dt.round(accf[d] / sumf);
      }
    }
  };
  int nt = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> th;
  for (int t = 0; t < nt; ++t)
    th.emplace_back(work, t, nt);
  for (auto &t : th)
    t.join();
}

static_assert(sizeof(fj_tensor_map) == sizeof(CUtensorMap), "an encoded map is copied byte for byte");
// Whether a kernel's plan loads K/V tiles by TMA (plan constant kTmaKv; older meta files lack it).
static bool tma_tiles(Kernel &K) {
  return K.c.count("kTmaKv") != 0 && K.c["kTmaKv"] != 0;
}

struct Gpu {
  Dev q, k, v, o, lse, table, lens, ws;
  SplitKLayout layout;
  SplitKShape shape;
  SplitKSchedule sched;
  fj_decode_params params{};
  fj_decode_tma_params tma{}; // TMA tile plans: the parameters, then the K/V maps (params_decode.h)
  Kernel *kern;
  bool owns_inputs = true; // false: q/k/v/table/lens belong to another Gpu (setup_gpu's `share`)
  // The kernel's parameter block (`params` changes between launches, e.g. the timeline step).
  void *arg() {
    if (!tma_tiles(*kern))
      return &params;
    tma.base = params;
    return &tma;
  }
};

// The maps' L2 promotion: 128-byte lines as runtime/tma_desc.cpp, or FJ_HARNESS_TMA_L2_PROMOTION
// = 0 (none), 64, 128 or 256 (a diagnostic).
static CUtensorMapL2promotion l2_promotion() {
  const char *env = getenv("FJ_HARNESS_TMA_L2_PROMOTION");
  const int bytes = env ? atoi(env) : 128;
  return bytes == 0    ? CU_TENSOR_MAP_L2_PROMOTION_NONE
         : bytes == 64  ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
         : bytes == 256 ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B
                        : CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
}

// A 4-D map {dim, heads_kv, rows, outer} over K or V (contiguous: rows are keys, outer the batch;
// paged: a page's rows, outer the pages), box {64, 1, box_rows, 1}, 128-byte swizzle
// (kernels/decode/traits.cuh TmaTile); rows past the extent read as zeros.
static fj_tensor_map kv_tensor_map(const Dev &buf, int dim, int heads_kv, int rows, int outer, long row, long head,
                                   long outer_stride, int box_rows) {
  constexpr int kPanelCols = 64;
  CUtensorMap map;
  const cuuint64_t dims[4] = {(cuuint64_t)dim, (cuuint64_t)heads_kv, (cuuint64_t)rows, (cuuint64_t)outer};
  const cuuint64_t strides[3] = {(cuuint64_t)head * 2, (cuuint64_t)row * 2, (cuuint64_t)outer_stride * 2};
  const cuuint32_t box[4] = {kPanelCols, 1, (cuuint32_t)box_rows, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  CK(cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, (void *)buf.p, dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            l2_promotion(), CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  fj_tensor_map out;
  memcpy(&out, &map, sizeof out);
  return out;
}

// Schedules compared by `ab` (compiler/splitk_schedule.hpp): the default, balanced by keys with a
// charge per extra piece of a run; the same without the charge; the tile-balanced one of runs 1-9.
// runtime: what runtime/decode.cpp plans (SplitKShape defaults: by keys only for long runs).
// whole / split: the runtime's schedule with whole units allowed up to kWholeUnitsExcessPct more
// tiles per run, or never.
enum class Sched { keys, keys_no_charge, tiles, runtime, whole, split };
constexpr int kWholeUnitsExcessPct = 10;
static const char *sched_name(Sched s) {
  return s == Sched::keys             ? "keys"
         : s == Sched::keys_no_charge ? "keys-nocharge"
         : s == Sched::tiles          ? "tiles"
         : s == Sched::whole          ? "whole"
         : s == Sched::split          ? "split"
                                      : "runtime";
}

static void setup_gpu(Gpu &g, const Problem &P, Kernel &K, int max_batch_pad = 0, Sched sched = Sched::keys,
                      const Gpu *share = nullptr, bool dealt = SplitKShape{}.whole_units_dealt, int grid = 0) {
  const Case &c = P.c;
  g.kern = &K;
  if (share != nullptr) {
    g.owns_inputs = false;
    g.q = share->q;
    g.k = share->k;
    g.v = share->v;
    g.table = share->table;
    g.lens = share->lens;
  } else {
    g.q.alloc(P.q.size() * 2);
    g.q.up(P.q.data(), P.q.size() * 2);
    g.k.alloc(P.k.size() * 2);
    g.k.up(P.k.data(), P.k.size() * 2);
    g.v.alloc(P.v.size() * 2);
    g.v.up(P.v.data(), P.v.size() * 2);
  }
  // O: [b, q_len, hq, dv (+pad)] with the same row padding as the inputs
  long o_head = c.dv + c.row_pad, o_row = P.hq * o_head, o_batch = c.q_len * o_row;
  g.o.alloc(P.batch * o_batch * 2);
  g.lse.alloc((size_t)P.batch * P.hq * c.q_len * 4);
  if (!P.table.empty() && share == nullptr) {
    g.table.alloc(P.table.size() * 4);
    g.table.up(P.table.data(), P.table.size() * 4);
  }
  if (share == nullptr) {
    g.lens.alloc(P.batch * 4);
    g.lens.up(c.lens.data(), P.batch * 4);
  }

  // grid > 0: a grid of that many CTAs instead of kCtasPerSm per SM (more than fit at once: the
  // hardware deals the later CTAs to the SMs that free up first).
  g.shape.num_sms = grid > 0 ? grid / (int)K.c["kCtasPerSm"] : g_sms;
  g.shape.ctas_per_sm = (int)K.c["kCtasPerSm"];
  g.shape.block_m = (int)K.c["kBlockM"];
  g.shape.block_n = (int)K.c["kBlockN"];
  g.shape.m_blocks = (int)K.c["kMBlocks"];
  g.shape.head_dim_v = c.dv;
  g.shape.heads_kv = c.heads_kv;
  g.shape.max_batch = P.batch + max_batch_pad;
  const bool paged_tma = tma_tiles(K) && c.page > 0;
  g.shape.piece_cost_keys = splitk_piece_cost_keys(c.dqk, c.dv, paged_tma); // as runtime/decode.cpp
  g.shape.whole_units_dealt = dealt;
  if (sched == Sched::whole || sched == Sched::split)
    g.shape.whole_units_max_excess_pct = sched == Sched::whole ? kWholeUnitsExcessPct : -1;
  else if (sched != Sched::runtime) {
    if (sched != Sched::keys)
      g.shape.piece_cost_keys = 0;
    if (sched == Sched::tiles)
      g.shape.split_granule = g.shape.block_n;
    else
      g.shape.key_balance_min_run_tiles = 0; // 'keys' is always by keys; the runtime's default chooses per shape
  }
  if (paged_tma)
    g.shape.split_granule = (int)K.c["kTmaBoxRows"]; // paged TMA tiles: pieces start on whole boxes
  // FJ_HARNESS_TMA_PIECE_COST=N: TMA kernels charge N keys per extra piece of a run (a diagnostic
  // of what a piece costs them; the runtime's charge otherwise).
  if (const char *cost = getenv("FJ_HARNESS_TMA_PIECE_COST"); cost != nullptr && tma_tiles(K))
    g.shape.piece_cost_keys = atoi(cost);
  std::string err;
  if (!splitk_layout(g.shape, &g.layout, &err)) {
    fprintf(stderr, "layout: %s\n", err.c_str());
    exit(2);
  }
  std::vector<char> host(g.layout.int_bytes);
  SplitKProblem sp;
  sp.seqlens_k = c.lens.data();
  sp.batch = P.batch;
  sp.q_len = c.q_len;
  sp.window_left = c.local ? c.wl : -1;
  if (!splitk_schedule(g.shape, g.layout, sp, host.data(), host.size(), &g.sched, &err)) {
    fprintf(stderr, "schedule: %s\n", err.c_str());
    exit(2);
  }
  g.ws.alloc(g.layout.total_bytes);
  g.ws.up(host.data(), host.size());

  fj_attention_params &a = g.params.attn;
  a.q = {(const void *)g.q.p, P.q_batch, P.q_row, P.q_head};
  a.k = {(const void *)g.k.p, c.page ? 0 : P.k_page_or_batch, P.k_row, P.k_head};
  a.v = {(const void *)g.v.p, c.page ? 0 : P.v_page_or_batch, P.v_row, P.v_head};
  a.o = {(const void *)g.o.p, o_batch, o_row, o_head};
  a.maybe_lse = (float *)g.lse.p;
  a.maybe_seqlens_k = (const int *)g.lens.p;
  a.paged.block_table = c.page ? (const int *)g.table.p : nullptr;
  a.paged.max_pages_per_seq = P.max_pages;
  a.paged.page_size = c.page;
  a.paged.page_stride_k = P.k_page_or_batch;
  a.paged.page_stride_v = P.v_page_or_batch;
  a.batch = P.batch;
  a.seqlen_q = c.q_len;
  a.seqlen_k = P.max_len;
  a.heads_q = P.hq;
  a.heads_kv = c.heads_kv;
  a.group = c.group;
  a.window_left = c.local ? c.wl : -1;
  a.window_right = c.local ? c.wr : -1;
  a.scale = 1.f / std::sqrt((float)c.dqk);
  a.scale_log2 = a.scale * 1.4426950408889634f;
  a.softcap = c.softcap ? c.cap : 0.f;
  a.softcap_inv = c.softcap ? 1.f / c.cap : 0.f;
  a.maybe_partial_o = (float *)(g.ws.p + g.layout.partial_o_offset);
  a.maybe_partial_lse = (float *)(g.ws.p + g.layout.partial_lse_offset);
  a.num_splits = 0;
  g.params.header = (const fj_decode_header *)(g.ws.p + g.layout.header_offset);
  g.params.slot_begin = (const int *)(g.ws.p + g.layout.slot_offset);
  g.params.work = (const fj_decode_work *)(g.ws.p + g.layout.work_offset);
  g.params.merges = (const fj_decode_merge *)(g.ws.p + g.layout.merge_offset);
  g.params.m_blocks = g.shape.m_blocks;
  if (tma_tiles(K)) {
    // Contiguous: {dim, heads_kv, keys, batch}, a box of a whole tile; paged: {dim, heads_kv,
    // page, pages}, a box of kTmaBoxRows keys.
    const int box_rows = (int)K.c["kTmaBoxRows"];
    const int rows = c.page > 0 ? c.page : P.max_len, outer = c.page > 0 ? P.num_pages : P.batch;
    g.tma.k_map = kv_tensor_map(g.k, c.dqk, c.heads_kv, rows, outer, P.k_row, P.k_head, P.k_page_or_batch, box_rows);
    g.tma.v_map = kv_tensor_map(g.v, c.dv, c.heads_kv, rows, outer, P.v_row, P.v_head, P.v_page_or_batch, box_rows);
  }
}

static bool g_pdl = true;
static void launch(Gpu &g, CUstream s = 0) {
  void *args[] = {g.arg()};
  Kernel &K = *g.kern;
  CK(cuLaunchKernel(K.decode, g.layout.grid, 1, 1, (unsigned)K.c["threads"], 1, 1, (unsigned)K.c["smem"], s, args,
                    nullptr));
  if (g.sched.num_merges == 0 || K.c["kFusedMerge"] != 0) // fused: the decode grid merged its splits
    return;
  CUlaunchConfig cfg{};
  cfg.gridDimX = g.layout.grid;
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = (unsigned)K.c["kCombineThreads"];
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.sharedMemBytes = 0;
  cfg.hStream = s;
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = g_pdl ? 1 : 0;
  CK(cuLaunchKernelEx(&cfg, K.combine, args, nullptr));
}

static void free_gpu(Gpu &g) {
  for (Dev *d : {&g.o, &g.lse, &g.ws})
    d->free();
  if (g.owns_inputs)
    for (Dev *d : {&g.q, &g.k, &g.v, &g.table, &g.lens})
      d->free();
}

struct Reference {
  std::vector<double> o64, lse64;
  std::vector<float> olp;
};

// One launch on `g` with O and LSE NaN-poisoned beforehand, every element checked against `ref`.
// Two launches go first, so what one launch leaves in the workspace (the merge counters the fused
// merge puts back to zero) is what the checked launch starts from.
static bool check_on_gpu(const Problem &P, Gpu &g, const Reference &ref, const std::string &label,
                         std::vector<uint16_t> *o_out = nullptr) {
  const Case &c = P.c;
  constexpr int kLaunchesBefore = 2;
  for (int i = 0; i < kLaunchesBefore; ++i)
    launch(g);
  CK(cuCtxSynchronize());
  long o_head = c.dv + c.row_pad, o_row = P.hq * o_head, o_batch = c.q_len * o_row;
  std::vector<uint16_t> poison(P.batch * o_batch, 0x7fff); // NaN in both fp16 and bf16
  g.o.up(poison.data(), poison.size() * 2);
  std::vector<float> lpoison(P.batch * P.hq * c.q_len, NAN);
  g.lse.up(lpoison.data(), lpoison.size() * 4);
  launch(g);
  CK(cuCtxSynchronize());
  std::vector<uint16_t> o(poison.size());
  g.o.down(o.data(), o.size() * 2);
  std::vector<float> lse(lpoison.size());
  g.lse.down(lse.data(), lse.size() * 4);
  DT dt{c.bf};
  double err = 0, err_lp = 0, err_lse = 0;
  long bad = 0;
  for (int b = 0; b < P.batch; ++b)
    for (int i = 0; i < c.q_len; ++i)
      for (int h = 0; h < P.hq; ++h)
        for (int d = 0; d < c.dv; ++d) {
          size_t r = (((size_t)b * c.q_len + i) * P.hq + h) * c.dv + d;
          float ours = dt.from(o[b * o_batch + i * o_row + h * o_head + d]);
          if (!std::isfinite(ours)) {
            ++bad;
            continue;
          }
          err = std::max(err, std::fabs(ours - ref.o64[r]));
          err_lp = std::max(err_lp, std::fabs(ref.olp[r] - ref.o64[r]));
        }
  for (size_t r = 0; r < lse.size(); ++r) {
    if (std::isinf(ref.lse64[r])) {
      if (!(std::isinf(lse[r]) && lse[r] < 0))
        ++bad;
    } else if (!std::isfinite(lse[r]))
      ++bad;
    else
      err_lse = std::max(err_lse, std::fabs(lse[r] - ref.lse64[r]));
  }
  double bound = 2 * err_lp + 1e-5;
  bool ok = bad == 0 && err <= bound && err_lse <= 1e-3;
  printf(
      "%-4s %-28s tag=%-10s units=%d work=%d merges=%d states=%d | max|o-ref|=%.3e bound=%.3e lse_err=%.2e bad=%ld\n",
      ok ? "PASS" : "FAIL", label.c_str(), c.tag.c_str(), P.batch * c.heads_kv * g.shape.m_blocks, g.sched.num_work,
      g.sched.num_merges, g.sched.num_states, err, bound, err_lse, bad);
  fflush(stdout);
  if (o_out)
    *o_out = o;
  return ok;
}

static bool run_check(const Case &c, Kernel &K, std::vector<uint16_t> *o_out = nullptr) {
  Problem P = make_problem(c, c.seed ? c.seed : std::hash<std::string>()(c.name));
  Gpu g;
  setup_gpu(g, P, K);
  Reference ref;
  reference(P, ref.o64, ref.lse64, ref.olp);
  const bool ok = check_on_gpu(P, g, ref, c.name, o_out);
  free_gpu(g);
  return ok;
}

// fj_combine's parameters for `states` states of `rows` packed rows (state-major, dv floats a row)
// merged into `out` (16-bit rows of dv) and `lse`; `merged_rows` of them are merged.
static fj_combine_params combine_params(const Dev &states_o, const Dev &states_lse, const Dev &out, const Dev &lse,
                                        int states, int rows, int merged_rows, int dv) {
  fj_combine_params p{};
  p.partial_o = (const float *)states_o.p;
  p.partial_lse = (const float *)states_lse.p;
  p.state_stride_o = (long)rows * dv;
  p.state_stride_lse = rows;
  p.o = (void *)out.p;
  p.o_row_stride = dv;
  p.maybe_lse = (float *)lse.p;
  p.num_states = states;
  p.rows = merged_rows;
  p.head_dim_v = dv;
  return p;
}

// Standalone merge of random states (fj_combine) vs float64.
static bool run_merge_check(Kernel &K, bool bf, int dv, int states, int rows) {
  std::mt19937_64 rng(states * 7919 + rows);
  std::uniform_real_distribution<float> U(-1.f, 1.f);
  std::vector<float> po((size_t)states * rows * dv), pl((size_t)states * rows);
  for (auto &x : po)
    x = U(rng);
  for (size_t i = 0; i < pl.size(); ++i) {
    pl[i] = U(rng) * 10.f;
    if (rng() % 5 == 0)
      pl[i] = -INFINITY; // empty states
  }
  for (int s = 0; s < states; ++s) // row 0: every state empty
    pl[(size_t)s * rows] = -INFINITY;
  Dev dpo, dpl, dout, dlse;
  dpo.alloc(po.size() * 4);
  dpo.up(po.data(), po.size() * 4);
  dpl.alloc(pl.size() * 4);
  dpl.up(pl.data(), pl.size() * 4);
  dout.alloc((size_t)rows * dv * 2);
  std::vector<uint16_t> poison((size_t)rows * dv, 0x7fff);
  dout.up(poison.data(), poison.size() * 2);
  dlse.alloc(rows * 4);
  fj_combine_params p = combine_params(dpo, dpl, dout, dlse, states, rows, rows, dv);
  void *args[] = {&p};
  CK(cuLaunchKernel(K.merge, g_sms * 2, 1, 1, (unsigned)K.c["kCombineThreads"], 1, 1, 0, 0, args, nullptr));
  CK(cuCtxSynchronize());
  std::vector<uint16_t> out(poison.size());
  dout.down(out.data(), out.size() * 2);
  std::vector<float> lse(rows);
  dlse.down(lse.data(), rows * 4);
  DT dt{bf};
  double err = 0, err_lp = 0, err_lse = 0;
  long bad = 0;
  for (int r = 0; r < rows; ++r) {
    double mx = -INFINITY;
    for (int s = 0; s < states; ++s)
      mx = std::max(mx, (double)pl[(size_t)s * rows + r]);
    double sum = 0;
    if (!std::isinf(mx))
      for (int s = 0; s < states; ++s)
        sum += std::exp(pl[(size_t)s * rows + r] - mx);
    double lref = std::isinf(mx) ? -INFINITY : mx + std::log(sum);
    if (std::isinf(lref) ? !(std::isinf(lse[r]) && lse[r] < 0) : !std::isfinite(lse[r]))
      ++bad;
    else if (!std::isinf(lref))
      err_lse = std::max(err_lse, std::fabs(lse[r] - lref));
    for (int d = 0; d < dv; ++d) {
      double ref = 0;
      if (!std::isinf(mx))
        for (int s = 0; s < states; ++s)
          ref += std::exp(pl[(size_t)s * rows + r] - lref) * po[((size_t)s * rows + r) * dv + d];
      float ours = dt.from(out[(size_t)r * dv + d]);
      if (!std::isfinite(ours)) {
        ++bad;
        continue;
      }
      err = std::max(err, std::fabs(ours - ref));
      err_lp = std::max(err_lp, std::fabs(dt.round((float)ref) - ref));
    }
  }
  double bound = 2 * err_lp + 1e-5;
  bool ok = bad == 0 && err <= bound && err_lse <= 1e-4;
  printf("%-4s merge_states states=%d rows=%d dv=%d %s | max|o-ref|=%.3e bound=%.3e lse_err=%.2e bad=%ld\n",
         ok ? "PASS" : "FAIL", states, rows, dv, bf ? "bf16" : "fp16", err, bound, err_lse, bad);
  for (Dev *d : {&dpo, &dpl, &dout, &dlse})
    d->free();
  return ok;
}

// The median of samples sorted in place.
static double median_of_sorted(const std::vector<float> &sorted) {
  return sorted[sorted.size() / 2];
}

// ---- bandwidth ----
static void run_perf(Kernel &K, const char *mode, const char *tag_of_perf, int batch, int len, int page) {
  const int hkv = 8, group = 4, d = 128;
  Case c;
  c.name = "perf";
  c.dqk = c.dv = d;
  c.group = group;
  c.heads_kv = hkv;
  c.page = page;
  c.lens.assign(batch, len);
  const double kv_bytes = (double)batch * len * hkv * d * 2 * 2;
  // Enough copies that the rotation walks >= 1 GB, so L2 (50 MB) never holds the next one.
  int copies = std::max(2, (int)std::ceil(1.0e9 / kv_bytes));
  // Build one problem (random data once, uploaded to every copy, block tables shuffled).
  Problem P = make_problem(c, 1234);
  std::vector<Gpu> gs(copies);
  for (int i = 0; i < copies; ++i)
    setup_gpu(gs[i], P, K);
  CUevent e0, e1;
  CK(cuEventCreate(&e0, 0));
  CK(cuEventCreate(&e1, 0));
  const int warm = 5, iters = 30;
  std::vector<float> ms;
  for (int it = 0; it < warm + iters; ++it) {
    Gpu &g = gs[it % copies];
    CK(cuEventRecord(e0, 0));
    launch(g);
    CK(cuEventRecord(e1, 0));
    CK(cuEventSynchronize(e1));
    float t;
    CK(cuEventElapsedTime(&t, e0, e1));
    if (it >= warm)
      ms.push_back(t);
  }
  std::vector<float> ms_nopdl;
  g_pdl = false;
  for (int it = 0; it < warm + iters; ++it) {
    Gpu &g = gs[it % copies];
    CK(cuEventRecord(e0, 0));
    launch(g);
    CK(cuEventRecord(e1, 0));
    CK(cuEventSynchronize(e1));
    float t;
    CK(cuEventElapsedTime(&t, e0, e1));
    if (it >= warm)
      ms_nopdl.push_back(t);
  }
  g_pdl = true;
  std::sort(ms_nopdl.begin(), ms_nopdl.end());
  // decode kernel alone
  std::vector<float> ms_dec;
  for (int it = 0; it < warm + iters; ++it) {
    Gpu &g = gs[it % copies];
    void *args[] = {g.arg()};
    CK(cuEventRecord(e0, 0));
    CK(cuLaunchKernel(K.decode, g.layout.grid, 1, 1, (unsigned)K.c["threads"], 1, 1, (unsigned)K.c["smem"], 0, args,
                      nullptr));
    CK(cuEventRecord(e1, 0));
    CK(cuEventSynchronize(e1));
    float t;
    CK(cuEventElapsedTime(&t, e0, e1));
    if (it >= warm)
      ms_dec.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  std::sort(ms_dec.begin(), ms_dec.end());
  double med = median_of_sorted(ms), med_dec = median_of_sorted(ms_dec);
  const double med_nopdl = median_of_sorted(ms_nopdl);
  printf(
      "PERF %-10s %-8s %3d x %-6d page=%-3d grid=%d work=%d merges=%d tiles/cta=%ld | total(PDL) %.1f us %.3f TB/s | "
      "total(no PDL) %.1f us %.3f TB/s | decode only %.1f us %.3f TB/s\n",
      mode, tag_of_perf, batch, len, page, gs[0].layout.grid, gs[0].sched.num_work, gs[0].sched.num_merges,
      (long)gs[0].sched.tiles_per_cta, med * 1e3, kv_bytes / (med * 1e-3) / 1e12, med_nopdl * 1e3,
      kv_bytes / (med_nopdl * 1e-3) / 1e12, med_dec * 1e3, kv_bytes / (med_dec * 1e-3) / 1e12);
  fflush(stdout);
  for (auto &g : gs)
    free_gpu(g);
}

// One decode step launched as the runtime does on sm_90: programmatic stream serialization (PDL).
static void launch_pdl(Gpu &g, CUstream s = 0) {
  void *args[] = {g.arg()};
  Kernel &K = *g.kern;
  CUlaunchConfig cfg{};
  cfg.gridDimX = g.layout.grid;
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = (unsigned)K.c["threads"];
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.sharedMemBytes = (unsigned)K.c["smem"];
  cfg.hStream = s;
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  CK(cuLaunchKernelEx(&cfg, K.decode, args, nullptr));
  if (g.sched.num_merges != 0 && K.c["kFusedMerge"] == 0)
    CK(cuLaunchKernelEx(&cfg, K.combine, args, nullptr)); // (not reached with the default fused plan)
}

// Interleaved timing of variants (each a ring of input copies): `rounds` rounds after one warm-up,
// each timing kLaunches back-to-back PDL steps per variant, the variants' order rotated per round.
// Returns every variant's sorted samples (us per step).
static std::vector<std::vector<float>> interleaved_step_us(std::vector<Gpu> *variants, int count, int rounds) {
  constexpr int kLaunches = 10;
  CUevent e0, e1;
  CK(cuEventCreate(&e0, 0));
  CK(cuEventCreate(&e1, 0));
  std::vector<std::vector<float>> us(count);
  std::vector<size_t> next(count, 0);
  for (int round = -1; round < rounds; ++round) { // round -1: warm-up
    for (int i = 0; i < count; ++i) {
      const int v = (std::max(round, 0) + i) % count;
      CK(cuEventRecord(e0, 0));
      for (int l = 0; l < kLaunches; ++l)
        launch_pdl(variants[v][next[v]++ % variants[v].size()]);
      CK(cuEventRecord(e1, 0));
      CK(cuEventSynchronize(e1));
      float ms;
      CK(cuEventElapsedTime(&ms, e0, e1));
      if (round >= 0)
        us[v].push_back(ms * 1e3f / kLaunches);
    }
  }
  CK(cuEventDestroy(e0));
  CK(cuEventDestroy(e1));
  for (std::vector<float> &samples : us)
    std::sort(samples.begin(), samples.end());
  return us;
}

// Same-process A/B of the schedules on one TARGETS shape (Hkv 8, group 4, d128, bf16, q_len 1):
// every variant first passes the float64 check (NaN-poisoned O and LSE, every element), then the
// variants are timed in interleaved rounds (the order rotating per round), each round a batch of
// back-to-back PDL launches over copies rotated through >= 1 GB per variant, so L2 never holds the
// next step's KV. Median of the rounds, TB/s of KV read.
static int run_ab(Kernel &K, const char *tag, int batch, int len, int page, const Reference &ref) {
  Case c;
  c.name = "ab";
  c.tag = tag;
  c.dqk = c.dv = 128;
  c.group = 4;
  c.heads_kv = 8;
  c.page = page;
  c.lens.assign(batch, len);
  c.fast_fill = true;
  const Problem P = make_problem(c, 4321);
  const double kv_bytes = (double)batch * len * c.heads_kv * c.dqk * 2 * 2;
  const int copies = std::max(2, (int)std::ceil(1.0e9 / kv_bytes));
  const Sched scheds[] = {Sched::tiles, Sched::keys, Sched::keys_no_charge};
  constexpr int kScheds = 3;
  std::vector<Gpu> gs[kScheds];
  int fails = 0;
  for (int v = 0; v < kScheds; ++v) {
    gs[v].resize(copies);
    for (Gpu &g : gs[v])
      setup_gpu(g, P, K, 0, scheds[v]);
    char label[96];
    snprintf(label, sizeof label, "ab %dx%d page%d %s", batch, len, page, sched_name(scheds[v]));
    fails += !check_on_gpu(P, gs[v][0], ref, label);
  }
  // Host cost of one schedule (the runtime's plan() runs it every step).
  double plan_us[kScheds];
  for (int v = 0; v < kScheds; ++v) {
    Gpu &g = gs[v][0];
    std::vector<char> host(g.layout.int_bytes);
    SplitKProblem sp;
    sp.seqlens_k = c.lens.data();
    sp.batch = batch;
    constexpr int kReps = 50;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kReps; ++i)
      splitk_schedule(g.shape, g.layout, sp, host.data(), host.size(), nullptr, nullptr);
    plan_us[v] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kReps;
  }
  constexpr int kRounds = 21;
  const std::vector<std::vector<float>> us = interleaved_step_us(gs, kScheds, kRounds);
  double med[kScheds];
  for (int v = 0; v < kScheds; ++v)
    med[v] = median_of_sorted(us[v]);
  for (int v = 0; v < kScheds; ++v) {
    const SplitKSchedule &sc = gs[v][0].sched;
    printf("AB %3d x %-6d page=%-2d %-13s %7.2f us %.3f TB/s %+6.2f%% vs tiles | min %.2f max %.2f | limit %lld keys "
           "%lld tiles, longest run %lld keys %lld tiles | work %d merges %d states %d | plan %.1f us\n",
           batch, len, page, sched_name(scheds[v]), med[v], kv_bytes / (med[v] * 1e-6) / 1e12,
           (med[0] / med[v] - 1) * 100, us[v].front(), us[v].back(), (long long)sc.run_limit,
           (long long)sc.run_tile_limit, (long long)sc.keys_per_cta, (long long)sc.tiles_per_cta, sc.num_work,
           sc.num_merges, sc.num_states, plan_us[v]);
  }
  fflush(stdout);
  for (auto &v : gs)
    for (Gpu &g : v)
      free_gpu(g);
  return fails;
}

// Page size of a harness tag: the number after its last "_p" (pf_p16 -> 16; none -> 0).
static int tag_page(const std::string &tag) {
  const size_t at = tag.rfind("_p");
  return at == std::string::npos ? 0 : atoi(tag.c_str() + at + 2);
}

// Same-process A/B of kernel variants (tags of one page size) on one TARGETS shape, each with the
// runtime's schedule: every variant first passes the float64 check (NaN-poisoned O and LSE), then
// the variants are timed in interleaved rounds as run_ab does. The variants share the input copies;
// one counter rotates the copies over all launches, so no launch finds its KV in L2.
static int run_kab(const std::vector<std::string> &tags, std::vector<Kernel *> kernels, int batch, int len,
                   const Reference &ref) {
  // "TAG:whole" / "TAG:split" / "TAG:keys" / "TAG:tiles": kernel TAG with that Sched; ":nextfit" (with
  // any of them) keeps whole units in next-fit order (SplitKShape::whole_units_dealt = false); ":gN" a
  // grid of N CTAs.
  auto sched_of = [&](int v) {
    return tags[v].find(":whole") != std::string::npos   ? Sched::whole
           : tags[v].find(":split") != std::string::npos ? Sched::split
           : tags[v].find(":keys") != std::string::npos  ? Sched::keys
           : tags[v].find(":tiles") != std::string::npos ? Sched::tiles
                                                         : Sched::runtime;
  };
  auto grid_of = [&](int v) { // ":gN": N CTAs; 0: the planner's kCtasPerSm per SM
    const size_t at = tags[v].find(":g");
    return at == std::string::npos ? 0 : atoi(tags[v].c_str() + at + 2);
  };
  Case c;
  c.name = "ab";
  c.tag = tags[0];
  c.dqk = c.dv = 128;
  c.group = 4;
  c.heads_kv = 8;
  c.page = tag_page(tags[0]);
  c.lens.assign(batch, len);
  c.fast_fill = true;
  const Problem P = make_problem(c, 4321);
  const double kv_bytes = (double)batch * len * c.heads_kv * c.dqk * 2 * 2;
  const int copies = std::max(3, (int)std::ceil(1.0e9 / kv_bytes));
  const int V = (int)tags.size();
  std::vector<std::vector<Gpu>> gs(V, std::vector<Gpu>(copies));
  int fails = 0;
  for (int i = 0; i < copies; ++i)
    for (int v = 0; v < V; ++v)
      setup_gpu(gs[v][i], P, *kernels[v], 0, sched_of(v), v == 0 ? nullptr : &gs[0][i],
                tags[v].find(":nextfit") == std::string::npos, grid_of(v));
  for (int v = 0; v < V; ++v) {
    char label[96];
    snprintf(label, sizeof label, "kab %dx%d page%d %s", batch, len, c.page, tags[v].c_str());
    fails += !check_on_gpu(P, gs[v][0], ref, label);
  }
  constexpr int kRounds = 15;
  const std::vector<std::vector<float>> us = interleaved_step_us(gs.data(), V, kRounds);
  std::vector<double> med(V);
  for (int v = 0; v < V; ++v)
    med[v] = median_of_sorted(us[v]);
  for (int v = 0; v < V; ++v) {
    const SplitKSchedule &sc = gs[v][0].sched;
    printf("KAB %3d x %-6d page=%-2d %-12s %7.2f us %.3f TB/s %+6.2f%% vs %s | min %.2f max %.2f | work %d merges %d "
           "states %d by_keys %d whole %d | regs/smem see gen.log\n",
           batch, len, c.page, tags[v].c_str(), med[v], kv_bytes / (med[v] * 1e-6) / 1e12, (med[0] / med[v] - 1) * 100,
           tags[0].c_str(), us[v].front(), us[v].back(), sc.num_work, sc.num_merges, sc.num_states, (int)sc.by_keys,
           (int)sc.whole_units);
  }
  fflush(stdout);
  for (int v = V - 1; v >= 0; --v)
    for (Gpu &g : gs[v])
      free_gpu(g);
  return fails;
}

// Timeline of back-to-back PDL steps (a cubin built with FJ_DECODE_TIMELINE: gen's TL=1): thread 0
// of every CTA records %globaltimer at entry (0), after griddepcontrol.wait (1), when its first tile
// has landed (2), at the end of its last piece's key loop (3), after its last state / O store (4),
// at the start of a fused merge (5), at exit (6); (7) = smid | pieces << 32. Printed per step
// relative to the previous step's last exit; the raw marks go to $OUT (or .) as CSV.
static void run_tl(const std::string &tag, Kernel &K, int batch, int len) {
  Case c;
  c.name = "perf";
  c.tag = tag;
  c.dqk = c.dv = 128;
  c.group = 4;
  c.heads_kv = 8;
  c.page = tag_page(tag);
  c.lens.assign(batch, len);
  const Problem P = make_problem(c, 99);
  const double kv_bytes = (double)batch * len * c.heads_kv * c.dqk * 2 * 2;
  const int copies = std::max(3, (int)std::ceil(1.0e9 / kv_bytes));
  std::vector<Gpu> gs(copies);
  for (int i = 0; i < copies; ++i)
    setup_gpu(gs[i], P, K, 0, Sched::runtime); // own inputs per copy: no step finds its KV in L2
  CUdeviceptr tl;
  size_t tl_bytes;
  CK(cuModuleGetGlobal(&tl, &tl_bytes, K.mod, "fj_decode_timeline"));
  // The kernel's fj_decode_timeline dimensions; event slots in the order of fj_decode_timeline_event
  // (templates/kernels/decode/timeline.cuh): entry, wait, first tile, loop end, stored, merge start, exit,
  // smid | pieces << 32.
  constexpr int kSteps = 8, kCtas = 1024, kEvents = 8;
  const int grid = gs[0].layout.grid;
  for (int it = 0; it < 6; ++it) // warm-up
    launch_pdl(gs[it % copies]);
  CK(cuCtxSynchronize());
  CK(cuMemsetD8(tl, 0, tl_bytes));
  for (int step = 0; step < kSteps; ++step) {
    Gpu &g = gs[step % copies];
    g.params.pad_ = step;
    launch_pdl(g);
  }
  CK(cuCtxSynchronize());
  std::vector<unsigned long long> h(tl_bytes / 8);
  CK(cuMemcpyDtoH(h.data(), tl, tl_bytes));
  auto at = [&](int step, int cta, int ev) { return h[((size_t)step * kCtas + cta) * kEvents + ev]; };
  const char *out_dir = getenv("OUT");
  char path[512];
  snprintf(path, sizeof path, "%s/tl_%s_%dx%d.csv", out_dir ? out_dir : ".", tag.c_str(), batch, len);
  if (FILE *f = fopen(path, "w")) {
    fprintf(f, "step,cta,entry,wait,first_tile,loop_end,stored,merge_start,exit,smid,pieces\n");
    for (int st = 0; st < kSteps; ++st)
      for (int b = 0; b < grid; ++b) {
        fprintf(f, "%d,%d", st, b);
        for (int e = 0; e < 7; ++e)
          fprintf(f, ",%llu", at(st, b, e));
        fprintf(f, ",%llu,%llu\n", at(st, b, 7) & 0xffffffffull, at(st, b, 7) >> 32);
      }
    fclose(f);
  }
  auto pct = [](std::vector<double> v, double q) {
    if (v.empty())
      return 0.0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)(q * (v.size() - 1) + 0.5))];
  };
  auto step_end = [&](int st) {
    unsigned long long e = 0;
    for (int b = 0; b < grid; ++b)
      e = std::max(e, at(st, b, 6));
    return e;
  };
  printf("TL %s %dx%d grid %d (us from the previous step's last exit; min / p50 / max over working CTAs)\n",
         tag.c_str(), batch, len, grid);
  for (int st = 1; st < kSteps; ++st) {
    const double t0 = (double)step_end(st - 1);
    std::vector<double> entry, wait, first, loop, stored, mstart, mlen, exit_;
    for (int b = 0; b < grid; ++b) {
      if (at(st, b, 6) == 0)
        continue; // no work
      entry.push_back((at(st, b, 0) - t0) * 1e-3);
      wait.push_back((at(st, b, 1) - t0) * 1e-3);
      first.push_back((at(st, b, 2) - (double)at(st, b, 1)) * 1e-3);
      loop.push_back((at(st, b, 3) - t0) * 1e-3);
      stored.push_back((at(st, b, 4) - t0) * 1e-3);
      exit_.push_back((at(st, b, 6) - t0) * 1e-3);
      if (at(st, b, 5) != 0) {
        mstart.push_back((at(st, b, 5) - t0) * 1e-3);
        mlen.push_back((at(st, b, 6) - (double)at(st, b, 5)) * 1e-3);
      }
    }
    auto three = [&](const std::vector<double> &v) {
      char buf[64];
      snprintf(buf, sizeof buf, "%6.2f/%6.2f/%6.2f", pct(v, 0), pct(v, 0.5), pct(v, 1));
      return std::string(buf);
    };
    printf("TL step %d: %.2f us | entry %s | wait %s | first tile after wait %s | loop end %s | stored %s | merges %zu "
           "start %s len %s | exit %s\n",
           st, (step_end(st) - t0) * 1e-3, three(entry).c_str(), three(wait).c_str(), three(first).c_str(),
           three(loop).c_str(), three(stored).c_str(), mstart.size(), three(mstart).c_str(), three(mlen).c_str(),
           three(exit_).c_str());
  }
  fflush(stdout);
  for (int i = copies - 1; i >= 0; --i)
    free_gpu(gs[i]);
}

// Time of fj_combine on the 1x32768 merge shape (session 11's open question: is the fused merge's
// ~3 us the merge's own dependent loads, or the states being fresh from 32 other SMs?). 8 CTAs of 4
// warps merge 32 rows (8 units x 4 packed rows) of `states` states each, as the fused merge's 8
// last arrivals do. Each figure is the per-node time of a graph of kNodes launches; the combine's
// own time is that less the per-node time of the same graph with 0 rows. "fresh": every combine
// follows a device copy that rewrites all of its states (copy engine / copy kernel writes through
// L2), and the copy-alone graph is subtracted instead.
static void run_ctime(Kernel &K) {
  constexpr int kNodes = 200, kRowsPerUnit = 4, kUnits = 8, kDv = 128;
  constexpr int kRows = kUnits * kRowsPerUnit;
  const int max_states = 32;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> U(-1.f, 1.f);
  std::vector<float> po((size_t)max_states * kRows * kDv), pl((size_t)max_states * kRows);
  for (auto &x : po)
    x = U(rng);
  for (auto &x : pl)
    x = U(rng) * 10.f;
  Dev dpo, dsrc, dpl, dout, dlse;
  dpo.alloc(po.size() * 4);
  dpo.up(po.data(), po.size() * 4);
  dsrc.alloc(po.size() * 4);
  dsrc.up(po.data(), po.size() * 4);
  dpl.alloc(pl.size() * 4);
  dpl.up(pl.data(), pl.size() * 4);
  dout.alloc((size_t)kRows * kDv * 2);
  dlse.alloc(kRows * 4);
  CUstream st;
  CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CUevent e0, e1;
  CK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
  CK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
  // Per-node µs of a graph of kNodes x (optional copy, optional combine of `states` states).
  auto per_node = [&](int states, int rows, bool copy, bool combine) {
    fj_combine_params p = combine_params(dpo, dpl, dout, dlse, states, kRows, rows, kDv);
    void *args[] = {&p};
    CK(cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (int i = 0; i < kNodes; ++i) {
      if (copy)
        CK(cuMemcpyDtoDAsync(dpo.p, dsrc.p, (size_t)states * kRows * kDv * 4, st));
      if (combine)
        CK(cuLaunchKernel(K.merge, kUnits, 1, 1, (unsigned)K.c["kCombineThreads"], 1, 1, 0, st, args, nullptr));
    }
    CUgraph graph;
    CK(cuStreamEndCapture(st, &graph));
    CUgraphExec exec;
    CK(cuGraphInstantiate(&exec, graph, 0));
    std::vector<float> samples;
    for (int r = 0; r < 12; ++r) {
      CK(cuEventRecord(e0, st));
      CK(cuGraphLaunch(exec, st));
      CK(cuEventRecord(e1, st));
      CK(cuEventSynchronize(e1));
      float ms = 0;
      CK(cuEventElapsedTime(&ms, e0, e1));
      if (r >= 2)
        samples.push_back(ms * 1000.f / kNodes);
    }
    CK(cuGraphExecDestroy(exec));
    CK(cuGraphDestroy(graph));
    std::sort(samples.begin(), samples.end());
    return median_of_sorted(samples);
  };
  const double empty = per_node(1, 0, false, true);
  printf("CTIME per-node us: combine with 0 rows %.2f\n", empty);
  for (int states : {1, 8, 16, 32}) {
    const double warm = per_node(states, kRows, false, true);
    const double copy_alone = per_node(states, kRows, true, false);
    const double fresh = per_node(states, kRows, true, true);
    printf("CTIME states %2d: combine %.2f us (less empty: %.2f) | copy %.2f, copy+combine %.2f (combine fresh, "
           "less copy and empty: %.2f)\n",
           states, warm, warm - empty, copy_alone, fresh, fresh - copy_alone - empty);
  }
  fflush(stdout);
  CK(cuEventDestroy(e0));
  CK(cuEventDestroy(e1));
  CK(cuStreamDestroy(st));
  for (Dev *d : {&dpo, &dsrc, &dpl, &dout, &dlse})
    d->free();
}

int main(int argc, char **argv) {
  g_dir = argc > 1 ? argv[1] : "cubins";
  std::string what = argc > 2 ? argv[2] : "all";
  {
    std::ifstream idx(g_dir + "/index.txt");
    std::string tag, name;
    while (idx >> tag >> name)
      g_index[tag] = name;
  }
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CK(cuDeviceGetAttribute(&g_sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  char devname[256];
  cuDeviceGetName(devname, sizeof devname, dev);
  printf("device %s, %d SMs\n", devname, g_sms);
  std::map<std::string, Kernel> kernels;
  auto K = [&](const std::string &tag) -> Kernel & {
    auto it = kernels.find(tag);
    if (it == kernels.end()) {
      it = kernels.emplace(tag, load_kernel(tag)).first;
      int blocks = 0;
      CK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, it->second.decode, (int)it->second.c["threads"],
                                                     (size_t)it->second.c["smem"]));
      printf("  [%s] %s: threads %ld smem %ld planned ctas/SM %ld, occupancy %d\n", tag.c_str(), g_index[tag].c_str(),
             it->second.c["threads"], it->second.c["smem"], it->second.c["kCtasPerSm"], blocks);
    }
    return it->second;
  };
  int fails = 0;
  if (what == "check" || what == "all") {
    // check PREFIX: every case runs the kernel tagged PREFIX + its tag (a variant's check set).
    const std::string prefix = what == "check" && argc > 3 ? argv[3] : "";
    std::vector<int> lens_mixed = {0, 1, 17, 1000, 4097, 63, 64, 65};
    std::vector<Case> cases;
    auto add = [&](std::string name, std::string tag, auto fn) {
      Case c;
      c.name = name;
      c.tag = prefix + tag;
      c.lens = lens_mixed;
      fn(c);
      cases.push_back(c);
    };
    // tags: see harness_specs.txt
    add("g4 q1 page16", "g4p16", [](Case &c) { c.page = 16; });
    add("g4 q1 page1", "g4p1", [](Case &c) { c.page = 1; });
    add("g4 q1 contiguous", "g4p0", [](Case &c) { c.page = 0; });
    add("g4 q1 page64", "g4p64", [](Case &c) { c.page = 64; });
    add("g4 q1 page48 (npot)", "g4p48", [](Case &c) { c.page = 48; });
    add("g1 q1 page16 fp16", "g1p16h", [](Case &c) {
      c.group = 1;
      c.bf = false;
      c.page = 16;
      c.heads_kv = 4;
    });
    add("g6 q1 page16", "g6p16", [](Case &c) {
      c.group = 6;
      c.page = 16;
    });
    add("g7 q1 page16 fp16", "g7p16h", [](Case &c) {
      c.group = 7;
      c.bf = false;
      c.page = 16;
    });
    add("g8 q1 page1", "g8p1", [](Case &c) {
      c.group = 8;
      c.page = 1;
    });
    add("g4 q4 causal page16", "g4q4c", [](Case &c) {
      c.q_len = 4;
      c.causal = true;
      c.page = 16;
    });
    add("g8 q4 causal page1 fp16", "g8q4ch", [](Case &c) {
      c.group = 8;
      c.q_len = 4;
      c.causal = true;
      c.page = 1;
      c.bf = false;
    });
    add("g7 q4 causal contiguous", "g7q4c", [](Case &c) {
      c.group = 7;
      c.q_len = 4;
      c.causal = true;
    });
    add("g4 q4 causal+window page16", "g4q4w", [](Case &c) {
      c.q_len = 4;
      c.causal = true;
      c.local = true;
      c.wl = 100;
      c.wr = 0;
      c.page = 16;
    });
    add("g4 q1 window(300,-1) page16", "g4w", [](Case &c) {
      c.local = true;
      c.wl = 300;
      c.wr = -1;
      c.page = 16;
    });
    add("g4 q1 softcap30 page16", "g4sc", [](Case &c) {
      c.softcap = true;
      c.cap = 30.f;
      c.page = 16;
    });
    add("d64 g4 q1 page16", "d64", [](Case &c) {
      c.dqk = c.dv = 64;
      c.page = 16;
    });
    add("d72 g4 q1 page16 fp16", "d72", [](Case &c) {
      c.dqk = c.dv = 72;
      c.page = 16;
      c.bf = false;
    });
    add("d80 g4 q4 causal contiguous", "d80", [](Case &c) {
      c.dqk = c.dv = 80;
      c.q_len = 4;
      c.causal = true;
    });
    add("d256 g8 q1 page16", "d256", [](Case &c) {
      c.dqk = c.dv = 256;
      c.group = 8;
      c.page = 16;
    });
    add("d192/128 g4 q1 page16", "d192", [](Case &c) {
      c.dqk = 192;
      c.dv = 128;
      c.page = 16;
    });
    add("g8 q16 causal page16 (2 mblk)", "g8q16", [](Case &c) {
      c.group = 8;
      c.q_len = 16;
      c.causal = true;
      c.page = 16;
    });
    add("unaligned rows fp16 contiguous", "unal", [](Case &c) {
      c.bf = false;
      c.row_pad = 1;
    });
    add("long split 1x32768 g4 page16", "g4p16", [](Case &c) {
      c.lens = {32768};
      c.page = 16;
      c.heads_kv = 2;
    });
    add("long split 2x20000 g8 q4 causal", "g8q4c16", [](Case &c) {
      c.lens = {20000, 7};
      c.group = 8;
      c.q_len = 4;
      c.causal = true;
      c.page = 16;
    });
    // Long rows: the schedule (balanced by keys) cuts units mid-tile and mid-page.
    add("long split 1x32768 g4 page48", "g4p48", [](Case &c) {
      c.lens = {32768, 1000};
      c.page = 48;
      c.heads_kv = 2;
    });
    add("long split 2x9000 g8 page1", "g8p1", [](Case &c) {
      c.lens = {9000, 5};
      c.group = 8;
      c.page = 1;
    });
    add("long split 3 lens g7 q4 causal contig", "g7q4c", [](Case &c) {
      c.lens = {12345, 777, 4097};
      c.group = 7;
      c.q_len = 4;
      c.causal = true;
    });
    add("long split q4 causal+window page16", "g4q4w", [](Case &c) {
      c.lens = {20000, 3000};
      c.q_len = 4;
      c.causal = true;
      c.local = true;
      c.wl = 1000;
      c.wr = 0;
      c.page = 16;
    });
    add("long split 1x20011 g4 page64", "g4p64", [](Case &c) {
      c.lens = {20011};
      c.page = 64;
      c.heads_kv = 2;
    });
    // A variant built for some cases only (TMA tiles: no window, page 1 or odd head dims) skips
    // the others, loudly.
    auto built = [&](const std::string &tag) {
      if (g_index.count(tag) != 0)
        return true;
      printf("SKIP %s: no kernel built for it\n", tag.c_str());
      return false;
    };
    for (const Case &c : cases)
      if (built(c.tag))
        fails += !run_check(c, K(c.tag));
    // Both cases checked against float64, then their outputs compared bit for bit (`what` says
    // which pair); counts as failures only when `count_checks` (the first two blocks' rule).
    auto same_bits = [&](const Case &a, const Case &b, const std::string &what, bool count_checks) {
      std::vector<uint16_t> oa, ob;
      const bool ok_a = run_check(a, K(a.tag), &oa), ok_b = run_check(b, K(b.tag), &ob);
      if (count_checks)
        fails += !ok_a + !ok_b;
      const bool same = oa.size() == ob.size() && memcmp(oa.data(), ob.data(), oa.size() * 2) == 0;
      printf("%-4s %s: outputs bitwise identical\n", same ? "PASS" : "FAIL", what.c_str());
      fails += !same;
    };
    // Long split, paged vs contiguous: same schedule (it depends on the lengths only), same bits.
    {
      Case a;
      a.name = "identity long paged48";
      a.tag = prefix + "g4p48";
      a.lens = {32768, 1000};
      a.heads_kv = 2;
      a.page = 48;
      a.seed = 77;
      Case b = a;
      b.name = "identity long contiguous";
      b.tag = prefix + "g4p0";
      b.page = 0;
      if (built(a.tag) && built(b.tag))
        same_bits(a, b, "long split paged48 vs contiguous", true);
    }
    // A variant against the default kernel, contiguous: the same arithmetic in the same order, so
    // the same bits (mixed lengths, then a long split).
    if (!prefix.empty() && built(prefix + "g4p0"))
      for (const std::vector<int> &lens : {lens_mixed, std::vector<int>{32768, 1000}}) {
        Case a;
        a.name = "identity variant vs default";
        a.tag = prefix + "g4p0";
        a.lens = lens;
        a.heads_kv = lens.size() == 2 ? 2 : a.heads_kv;
        a.seed = 123;
        Case b = a;
        b.tag = "g4p0";
        same_bits(a, b, a.tag + " and g4p0, " + std::to_string(lens.size()) + " lengths", true);
      }
    // paged vs contiguous: identical outputs (same split, same order of arithmetic)
    {
      Case a;
      a.name = "identity paged16";
      a.tag = prefix + "g4p16";
      a.lens = lens_mixed;
      a.page = 16;
      a.seed = 99;
      Case b = a;
      b.name = "identity contiguous";
      b.tag = prefix + "g4p0";
      b.page = 0;
      if (built(a.tag) && built(b.tag))
        same_bits(a, b, "paged16 vs contiguous", false);
    }
    if (built(prefix + "g4p16"))
      for (int states : {1, 3, 17, 100})
        fails += !run_merge_check(K(prefix + "g4p16"), true, 128, states, 64);
    if (built(prefix + "d72"))
      fails += !run_merge_check(K(prefix + "d72"), false, 72, 5, 33);
    printf("CHECK failures: %d\n", fails);
    fflush(stdout);
  }
  if (what == "ab") {
    struct S {
      int b, l;
    } shapes[] = {{1, 32768}, {8, 8192}, {64, 4096}, {1, 131072}};
    for (auto s : shapes) {
      Case c; // the logical data of run_ab's problems (same seed): one reference for every layout
      c.name = "ab";
      c.dqk = c.dv = 128;
      c.group = 4;
      c.heads_kv = 8;
      c.lens.assign(s.b, s.l);
      c.fast_fill = true;
      Reference ref;
      {
        const Problem P = make_problem(c, 4321);
        reference(P, ref.o64, ref.lse64, ref.olp);
      }
      for (auto [tag, page] : {std::pair<const char *, int>{"pf_p0", 0}, {"pf_p16", 16}, {"pf_p64", 64}})
        fails += run_ab(K(tag), tag, s.b, s.l, page, ref);
    }
    printf("AB check failures: %d\n", fails);
  }
  // kab SHAPES GROUP...: SHAPES like 1x32768,8x8192; each GROUP a comma list of tags of one page size
  // (the first is the baseline of its group).
  // tl SHAPES TAG...: timelines of timeline builds.
  auto split = [](const std::string &text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    std::string item;
    while (std::getline(in, item, ','))
      if (!item.empty())
        out.push_back(item);
    return out;
  };
  auto shapes_of = [&](const std::string &text) {
    std::vector<std::pair<int, int>> out;
    for (const std::string &sh : split(text))
      out.push_back({atoi(sh.c_str()), atoi(sh.c_str() + sh.find('x') + 1)});
    return out;
  };
  if (what == "kab" && argc > 4) {
    for (auto [b, l] : shapes_of(argv[3])) {
      Case c;
      c.name = "ab";
      c.dqk = c.dv = 128;
      c.group = 4;
      c.heads_kv = 8;
      c.lens.assign(b, l);
      c.fast_fill = true;
      Reference ref;
      {
        const Problem P = make_problem(c, 4321);
        reference(P, ref.o64, ref.lse64, ref.olp);
      }
      for (int gi = 4; gi < argc; ++gi) {
        const std::vector<std::string> tags = split(argv[gi]);
        std::vector<Kernel *> ks;
        for (const std::string &t : tags)
          ks.push_back(&K(t.substr(0, t.find(':'))));
        fails += run_kab(tags, ks, b, l, ref);
      }
    }
    printf("KAB check failures: %d\n", fails);
  }
  if (what == "ctime" && argc > 3)
    run_ctime(K(argv[3]));
  if (what == "tl" && argc > 4) {
    for (auto [b, l] : shapes_of(argv[3]))
      for (int ti = 4; ti < argc; ++ti)
        run_tl(argv[ti], K(argv[ti]), b, l);
  }
  if (what == "perf" || what == "all") {
    struct S {
      int b, l;
    } shapes[] = {{1, 32768}, {8, 8192}, {64, 4096}, {1, 131072}};
    for (auto s : shapes)
      for (auto [tag, page] :
           {std::pair<const char *, int>{"pf_p0", 0}, {"pf_p16", 16}, {"pf_p64", 64}, {"x6c1_p0", 0}, {"x6c1_p16", 16}})
        run_perf(K(tag), page == 0 ? "contiguous" : "paged", tag, s.b, s.l, page);
  }
  return fails != 0;
}
