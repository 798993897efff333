// GPU check of the MLIR-built fa2 prefill kernel (compiler/mlir/gen_fa2.cpp) against a float64
// reference and against the NVRTC build of the same spec and plan (cubins + a .meta line from
// scripts/make-mlir-parity-fa2.sh, carried in build-device/mlir-parity-fa2). Host only: driver
// API, -lcuda; no LLVM needed. On the GPU machine:
//   g++ -std=c++17 -O2 tests/mlir_parity/check_fa2.cpp -I. -Itemplates -I/usr/local/cuda/include -lcuda -o check_fa2
//   ./check_fa2 build-device/mlir-parity-fa2/<tag>
// Per spec: two small problems (seqlen_q < seqlen_k, and seqlen_q > seqlen_k so causal rows and
// whole tiles see no key: O = 0, LSE = -inf), GQA group 2, padded head / row strides (odd element
// strides and an odd base for element-aligned specs), varlen / paged / window / softcap as the spec
// says. O and LSE are NaN-poisoned first; every element is checked. Pass rule (team):
// max|ours - ref64| <= 2 * max|naive - ref64| + 1e-5, naive = plain attention on the same 16-bit
// inputs with fp32 accumulation, rounded to the dtype; LSE to 1e-3 relative. Then both cubins are
// timed on a S = 4096 problem (cuEvent, kTimedLaunches launches) and TFLOP/s printed.
#include "tests/mlir_parity/driver_check.hpp"

#include "kernel_params.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int kTimedLaunches = 200;
constexpr int kWarmupLaunches = 10;
constexpr int kGroup = 2;        // query heads per KV head
constexpr int kHeadsQ = 4;       // correctness problems
constexpr int kTimedHeadsQ = 16; // timed problem
constexpr int kTimedBatch = 2;
constexpr int kTimedSeqlen = 4096;
constexpr float kSoftcap = 30.f;
constexpr int kWindowLeft = 100, kWindowRight = 20;
// Far pages (paged specs): one sequence over kFarPages pages of a shuffled table, laid out kFarGapBytes
// apart. A 1 GiB gap keeps the page stride within 32 bits while pages 2 and 3 lie past 2^31 bytes (the
// stream's mul.wide form); a 2 GiB gap takes its 64-bit form.
constexpr int kFarPages = 4;
constexpr int kFarQueries = 5;
constexpr size_t kFarGapBytes[] = {size_t{1} << 30, size_t{1} << 31};

struct Meta {
  int threads, smem, block_m, dqk, dv, bf16, causal, local, softcap, varlen, page_size, align;
};

// One problem in memory: Q/O rows packed [rows, heads, dim + pad] (batch mode is the packed form
// with batch_stride = seqlen * row_stride), K/V the same or paged [pages, page_size, heads_kv, dim + pad].
struct Problem {
  int batch, heads_q, heads_kv;
  std::vector<int> sq, sk; // per sequence
  int max_sq, max_sk, total_q, total_k;
  std::vector<int> q_start, k_start; // first packed row of each sequence
  int pad;  // elements after each head's dim (row/head strides stay 16-byte multiples iff pad % 8 == 0)
  int base; // elements before element 0 of every tensor (1 for element-aligned specs)
  std::vector<uint16_t> q, k, v; // host copies, laid out as on the device
  std::vector<int32_t> block_table;
  int pages_per_seq = 0, num_pages = 0;
  long q_row, k_row, v_row, o_row; // row strides (elements)
  size_t o_elems, lse_elems;
};

struct Device {
  CUdeviceptr q, k, v, o, lse, cu_q, cu_k, seqlens_k, block_table;
};

Problem make_problem(const Meta &m, int batch, int heads_q, std::vector<int> sq, std::vector<int> sk, uint32_t seed,
                     bool fill) {
  Problem pr{};
  pr.batch = batch;
  pr.heads_q = heads_q;
  pr.heads_kv = heads_q / kGroup;
  pr.sq = sq;
  pr.sk = sk;
  pr.max_sq = *std::max_element(sq.begin(), sq.end());
  pr.max_sk = *std::max_element(sk.begin(), sk.end());
  // batch mode: every sequence occupies max rows; varlen: packed back to back
  pr.q_start.resize(batch);
  pr.k_start.resize(batch);
  int qr = 0, kr = 0;
  for (int b = 0; b < batch; ++b) {
    pr.q_start[b] = qr;
    pr.k_start[b] = kr;
    qr += m.varlen ? sq[b] : pr.max_sq;
    kr += m.varlen ? sk[b] : pr.max_sk;
  }
  pr.total_q = qr;
  pr.total_k = kr;
  pr.pad = m.align >= 16 ? 8 : 1;
  pr.base = m.align >= 16 ? 0 : 1;
  pr.q_row = long(heads_q) * (m.dqk + pr.pad);
  pr.k_row = long(pr.heads_kv) * (m.dqk + pr.pad);
  pr.v_row = long(pr.heads_kv) * (m.dv + pr.pad);
  pr.o_row = long(heads_q) * (m.dv + pr.pad);
  size_t k_rows = pr.total_k;
  if (m.page_size > 0) {
    pr.pages_per_seq = (pr.max_sk + m.page_size - 1) / m.page_size;
    pr.num_pages = batch * pr.pages_per_seq;
    std::vector<int32_t> perm(pr.num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(seed + 1));
    pr.block_table = perm; // [batch, pages_per_seq]
    k_rows = size_t(pr.num_pages) * m.page_size;
  }
  pr.q.assign(pr.base + size_t(pr.total_q) * pr.q_row, 0);
  pr.k.assign(pr.base + k_rows * pr.k_row, 0);
  pr.v.assign(pr.base + k_rows * pr.v_row, 0);
  pr.o_elems = pr.base + size_t(pr.total_q) * pr.o_row;
  pr.lse_elems = m.varlen ? size_t(heads_q) * pr.total_q : size_t(batch) * heads_q * pr.max_sq;
  if (fill) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    auto to16 = [&](float f) { return m.bf16 ? parity::f32_to_bf16(f) : parity::f32_to_f16(f); };
    for (auto &x : pr.q)
      x = to16(normal(rng) * 1.5f); // logits with some spread
    for (auto &x : pr.k)
      x = to16(normal(rng));
    for (auto &x : pr.v)
      x = to16(normal(rng));
  }
  return pr;
}

// Element offset of key row `j` of sequence b (head 0, dim 0) in K (or V with `row`).
size_t kv_at(const Meta &m, const Problem &pr, int b, int j, long row) {
  if (m.page_size > 0) {
    const int page = pr.block_table[size_t(b) * pr.pages_per_seq + j / m.page_size];
    return pr.base + (size_t(page) * m.page_size + j % m.page_size) * row;
  }
  return pr.base + size_t(pr.k_start[b] + j) * row;
}

struct Reference {
  std::vector<double> o, lse;
  std::vector<float> naive;
  double naive_err = 0;
};

Reference reference(const Meta &m, const Problem &pr, float scale) {
  auto from16 = [&](uint16_t h) { return m.bf16 ? parity::bf16_to_f32(h) : parity::f16_to_f32(h); };
  auto to16 = [&](float f) { return m.bf16 ? parity::f32_to_bf16(f) : parity::f32_to_f16(f); };
  Reference r;
  r.o.assign(pr.o_elems, 0);
  r.naive.assign(pr.o_elems, 0);
  r.lse.assign(pr.lse_elems, -INFINITY);
  std::vector<double> s;
  std::vector<float> sf;
  for (int b = 0; b < pr.batch; ++b)
    for (int h = 0; h < pr.heads_q; ++h)
      for (int i = 0; i < pr.sq[b]; ++i) {
        const int hk = h / kGroup, diag = i + pr.sk[b] - pr.sq[b];
        int lo = 0, hi = pr.sk[b];
        if (m.causal)
          hi = std::min(hi, diag + 1);
        if (m.local) {
          lo = std::max(lo, diag - kWindowLeft);
          hi = std::min(hi, diag + kWindowRight + 1);
        }
        const uint16_t *qr = &pr.q[pr.base + size_t(pr.q_start[b] + i) * pr.q_row + size_t(h) * (m.dqk + pr.pad)];
        s.assign(std::max(hi - lo, 0), 0);
        sf.assign(s.size(), 0);
        double mx = -INFINITY;
        float mxf = -INFINITY;
        for (int j = lo; j < hi; ++j) {
          const uint16_t *kr = &pr.k[kv_at(m, pr, b, j, pr.k_row) + size_t(hk) * (m.dqk + pr.pad)];
          double acc = 0;
          float accf = 0;
          for (int d = 0; d < m.dqk; ++d) {
            const float a = from16(qr[d]), c = from16(kr[d]);
            acc += double(a) * c;
            accf += a * c;
          }
          acc *= scale;
          accf *= scale;
          if (m.softcap) {
            acc = kSoftcap * std::tanh(acc / kSoftcap);
            accf = kSoftcap * std::tanh(accf / kSoftcap);
          }
          s[j - lo] = acc;
          sf[j - lo] = accf;
          mx = std::max(mx, acc);
          mxf = std::max(mxf, accf);
        }
        double sum = 0;
        float sumf = 0;
        for (size_t j = 0; j < s.size(); ++j) {
          s[j] = std::exp(s[j] - mx);
          sum += s[j];
          sf[j] = std::exp(sf[j] - mxf);
          sumf += sf[j];
        }
        const size_t lse_i =
            m.varlen ? size_t(h) * pr.total_q + pr.q_start[b] + i : (size_t(b) * pr.heads_q + h) * pr.max_sq + i;
        if (!s.empty())
          r.lse[lse_i] = mx + std::log(sum);
        const size_t o0 = pr.base + size_t(pr.q_start[b] + i) * pr.o_row + size_t(h) * (m.dv + pr.pad);
        for (int d = 0; d < m.dv; ++d) {
          double acc = 0;
          float accf = 0;
          for (int j = lo; j < hi; ++j) {
            const float vv = from16(pr.v[kv_at(m, pr, b, j, pr.v_row) + size_t(hk) * (m.dv + pr.pad) + d]);
            acc += s[j - lo] * vv;
            accf += sf[j - lo] * vv;
          }
          r.o[o0 + d] = s.empty() ? 0 : acc / sum;
          r.naive[o0 + d] = s.empty() ? 0.f : from16(to16(accf / sumf));
          r.naive_err = std::max(r.naive_err, std::fabs(r.naive[o0 + d] - r.o[o0 + d]));
        }
      }
  return r;
}

template <typename T> CUdeviceptr upload(const std::vector<T> &host) {
  CUdeviceptr d = 0;
  if (host.empty())
    return 0;
  CK(cuMemAlloc(&d, host.size() * sizeof(T)));
  CK(cuMemcpyHtoD(d, host.data(), host.size() * sizeof(T)));
  return d;
}

Device to_device(const Meta &m, const Problem &pr) {
  Device d{};
  d.q = upload(pr.q);
  d.k = upload(pr.k);
  d.v = upload(pr.v);
  CK(cuMemAlloc(&d.o, pr.o_elems * 2));
  CK(cuMemAlloc(&d.lse, pr.lse_elems * 4));
  if (m.varlen) {
    std::vector<int32_t> cq(pr.batch + 1), ck(pr.batch + 1);
    for (int b = 0; b <= pr.batch; ++b) {
      cq[b] = b < pr.batch ? pr.q_start[b] : pr.total_q;
      ck[b] = b < pr.batch ? pr.k_start[b] : pr.total_k;
    }
    d.cu_q = upload(cq);
    d.cu_k = upload(ck);
  }
  if (m.page_size > 0) {
    d.block_table = upload(pr.block_table);
    d.seqlens_k = upload(std::vector<int32_t>(pr.sk.begin(), pr.sk.end()));
  }
  return d;
}

void free_device(Device &d) {
  for (CUdeviceptr p : {d.q, d.k, d.v, d.o, d.lse, d.cu_q, d.cu_k, d.seqlens_k, d.block_table})
    if (p)
      CK(cuMemFree(p));
}

fj_attention_params params_for(const Meta &m, const Problem &pr, const Device &d, float scale) {
  fj_attention_params p{};
  const long base_bytes = long(pr.base) * 2;
  auto tensor = [&](CUdeviceptr ptr, long row, int rows_per_seq, int dim) {
    return fj_tensor_ref{reinterpret_cast<const void *>(ptr + base_bytes), (fj_i64)row * rows_per_seq, (fj_i64)row,
                         (fj_i64)(dim + pr.pad)};
  };
  p.q = tensor(d.q, pr.q_row, pr.max_sq, m.dqk);
  p.k = tensor(d.k, pr.k_row, pr.max_sk, m.dqk);
  p.v = tensor(d.v, pr.v_row, pr.max_sk, m.dv);
  p.o = tensor(d.o, pr.o_row, pr.max_sq, m.dv);
  p.maybe_lse = reinterpret_cast<float *>(d.lse);
  p.maybe_cu_seqlens_q = reinterpret_cast<const fj_i32 *>(d.cu_q);
  p.maybe_cu_seqlens_k = reinterpret_cast<const fj_i32 *>(d.cu_k);
  p.maybe_seqlens_k = reinterpret_cast<const fj_i32 *>(d.seqlens_k);
  if (m.page_size > 0) {
    p.paged.block_table = reinterpret_cast<const fj_i32 *>(d.block_table);
    p.paged.max_pages_per_seq = pr.pages_per_seq;
    p.paged.page_size = m.page_size;
    p.paged.page_stride_k = (fj_i64)m.page_size * pr.k_row;
    p.paged.page_stride_v = (fj_i64)m.page_size * pr.v_row;
  }
  p.batch = pr.batch;
  p.seqlen_q = pr.max_sq;
  p.seqlen_k = pr.max_sk;
  p.total_q = pr.total_q;
  p.heads_q = pr.heads_q;
  p.heads_kv = pr.heads_kv;
  p.group = kGroup;
  p.window_left = m.local ? kWindowLeft : -1;
  p.window_right = m.local ? kWindowRight : -1;
  p.scale = scale;
  p.scale_log2 = scale * 1.4426950408889634f;
  p.softcap = m.softcap ? kSoftcap : 0.f;
  p.softcap_inv = m.softcap ? 1.f / kSoftcap : 0.f;
  p.num_m_blocks = (pr.max_sq + m.block_m - 1) / m.block_m;
  return p;
}

// K or V of `pr` uploaded with each of its `num_pages` packed pages (`page_elems` elements) at a page
// stride of `stride` elements; the gaps stay unwritten.
CUdeviceptr upload_spread(const std::vector<uint16_t> &packed, int base, int num_pages, size_t page_elems,
                          size_t stride) {
  CUdeviceptr d = 0;
  CK(cuMemAlloc(&d, (base + size_t(num_pages) * stride) * 2));
  for (int page = 0; page < num_pages; ++page)
    CK(cuMemcpyHtoD(d + (base + page * stride) * 2, packed.data() + base + page * page_elems, page_elems * 2));
  return d;
}

struct Kernel {
  CUmodule mod;
  CUfunction fn;
};

Kernel load(const std::string &path, const Meta &m) {
  std::vector<char> cubin = parity::read_file(path);
  if (cubin.empty()) {
    std::printf("no cubin at %s\n", path.c_str());
    std::exit(1);
  }
  Kernel k;
  CK(cuModuleLoadData(&k.mod, cubin.data()));
  CK(cuModuleGetFunction(&k.fn, k.mod, "fj_fa2_prefill"));
  CK(cuFuncSetAttribute(k.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, m.smem));
  return k;
}

void launch(const Kernel &k, const Meta &m, fj_attention_params &p) {
  void *args[] = {&p};
  CK(cuLaunchKernel(k.fn, p.num_m_blocks, p.heads_q, p.batch, m.threads, 1, 1, m.smem, nullptr, args, nullptr));
}

// O of one launch (NaN-poisoned first), the whole buffer.
std::vector<uint16_t> run_output(const Kernel &k, const Meta &m, const Problem &pr, const Device &d,
                                 fj_attention_params p) {
  CK(cuMemsetD16(d.o, 0x7fff, pr.o_elems));
  CK(cuMemsetD32(d.lse, 0x7fc00000, pr.lse_elems));
  launch(k, m, p);
  CK(cuCtxSynchronize());
  std::vector<uint16_t> out(pr.o_elems);
  CK(cuMemcpyDtoH(out.data(), d.o, pr.o_elems * 2));
  return out;
}

// Paged specs: the far-pages problem in both builds, each gap's output bit for bit the packed
// layout's, and the packed output within the pass rule of the float64 reference. Returns failures.
int check_far_pages(const Kernel (&kernels)[2], const char *const (&names)[2], const Meta &m, const std::string &tag,
                    float scale) {
  auto from16 = [&](uint16_t h) { return m.bf16 ? parity::bf16_to_f32(h) : parity::f16_to_f32(h); };
  const int keys = (kFarPages - 1) * m.page_size + 1;
  Problem pr = make_problem(m, 1, kHeadsQ, {kFarQueries}, {keys}, 4321, true);
  const Reference ref = reference(m, pr, scale);
  const double tol = 2 * ref.naive_err + 1e-5;
  Device d = to_device(m, pr);
  int failures = 0;
  for (int which = 0; which < 2; ++which) {
    const std::vector<uint16_t> packed = run_output(kernels[which], m, pr, d, params_for(m, pr, d, scale));
    double err = 0;
    for (int i = 0; i < pr.sq[0]; ++i)
      for (int h = 0; h < pr.heads_q; ++h)
        for (int c = 0; c < m.dv; ++c) {
          const size_t at = pr.base + size_t(pr.q_start[0] + i) * pr.o_row + size_t(h) * (m.dv + pr.pad) + c;
          const double e = std::fabs(double(from16(packed[at])) - ref.o[at]);
          err = std::max(err, std::isnan(e) ? INFINITY : e);
        }
    const bool packed_pass = err <= tol;
    failures += !packed_pass;
    std::printf("%s far pages (%d keys in %d pages) %-5s packed max|o - ref64| %.3g (tol %.3g): %s\n", tag.c_str(),
                keys, pr.num_pages, names[which], err, tol, packed_pass ? "PASS" : "FAIL");
    for (const size_t gap : kFarGapBytes) {
      const size_t gap_elems = gap / 2;
      const size_t k_page = size_t(m.page_size) * pr.k_row, v_page = size_t(m.page_size) * pr.v_row;
      Device far = d;
      far.k = upload_spread(pr.k, pr.base, pr.num_pages, k_page, k_page + gap_elems);
      far.v = upload_spread(pr.v, pr.base, pr.num_pages, v_page, v_page + gap_elems);
      fj_attention_params p = params_for(m, pr, far, scale);
      p.paged.page_stride_k = fj_i64(k_page + gap_elems);
      p.paged.page_stride_v = fj_i64(v_page + gap_elems);
      const std::vector<uint16_t> spread = run_output(kernels[which], m, pr, far, p);
      CK(cuMemFree(far.k));
      CK(cuMemFree(far.v));
      const long differ = long(std::inner_product(spread.begin(), spread.end(), packed.begin(), size_t{0},
                                                  std::plus<>(), std::not_equal_to<>()));
      failures += differ != 0;
      std::printf("%s far pages, %zu MiB apart, %-5s against packed: %ld of %zu outputs differ in bits: %s\n",
                  tag.c_str(), gap >> 20, names[which], differ, spread.size(), differ == 0 ? "PASS" : "FAIL");
    }
  }
  free_device(d);
  return failures;
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::printf("usage: %s <dir>/<tag>   (reads <tag>.meta, <tag>.mlir.cubin, <tag>.nvrtc.cubin)\n", argv[0]);
    return 1;
  }
  const std::string base = argv[1];
  Meta m{};
  {
    std::vector<char> text = parity::read_file(base + ".meta");
    std::istringstream meta(std::string(text.begin(), text.end()));
    if (!(meta >> m.threads >> m.smem >> m.block_m >> m.dqk >> m.dv >> m.bf16 >> m.causal >> m.local >> m.softcap >>
          m.varlen >> m.page_size >> m.align)) {
      std::printf("bad %s.meta\n", base.c_str());
      return 1;
    }
  }
  auto from16 = [&](uint16_t h) { return m.bf16 ? parity::bf16_to_f32(h) : parity::f16_to_f32(h); };
  const float scale = 1.f / std::sqrt(float(m.dqk));
  const std::string tag = base.substr(base.find_last_of('/') + 1);

  parity::open_device();
  Kernel kernels[2] = {load(base + ".mlir.cubin", m), load(base + ".nvrtc.cubin", m)};
  const char *names[2] = {"mlir", "nvrtc"};

  // Correctness: seqlen_q < seqlen_k, then seqlen_q > seqlen_k (empty causal rows and tiles).
  struct Shape {
    std::vector<int> sq, sk;
  };
  const Shape shapes[] = {{{300, 77, 129}, {517, 77, 300}}, {{517, 1, 200}, {300, 64, 33}}};
  int failures = 0;
  for (int shape = 0; shape < 2; ++shape) {
    Shape sh = shapes[shape];
    if (!m.varlen && m.page_size == 0) // batch mode: one length for every sequence
      for (auto *v : {&sh.sq, &sh.sk})
        v->assign(v->size(), (*v)[0]);
    if (!m.varlen)
      sh.sq.assign(sh.sq.size(), sh.sq[0]); // paged: per-sequence KV lengths only
    Problem pr = make_problem(m, int(sh.sq.size()), kHeadsQ, sh.sq, sh.sk, 1234 + shape, true);
    Reference ref = reference(m, pr, scale);
    const double tol = 2 * ref.naive_err + 1e-5;
    Device d = to_device(m, pr);
    std::vector<std::vector<uint16_t>> outputs;
    for (int which = 0; which < 2; ++which) {
      CK(cuMemsetD16(d.o, 0x7fff, pr.o_elems)); // NaN in both dtypes
      CK(cuMemsetD32(d.lse, 0x7fc00000, pr.lse_elems));
      fj_attention_params p = params_for(m, pr, d, scale);
      launch(kernels[which], m, p);
      CK(cuCtxSynchronize());
      std::vector<uint16_t> out(pr.o_elems);
      std::vector<float> lse(pr.lse_elems);
      CK(cuMemcpyDtoH(out.data(), d.o, pr.o_elems * 2));
      CK(cuMemcpyDtoH(lse.data(), d.lse, pr.lse_elems * 4));
      double err = 0, lse_err = 0;
      long bad = 0, checked = 0, empty_rows = 0;
      std::vector<uint16_t> valid;
      for (int b = 0; b < pr.batch; ++b)
        for (int i = 0; i < pr.sq[b]; ++i)
          for (int h = 0; h < pr.heads_q; ++h) {
            const size_t o0 = pr.base + size_t(pr.q_start[b] + i) * pr.o_row + size_t(h) * (m.dv + pr.pad);
            for (int c = 0; c < m.dv; ++c) {
              const double e = std::fabs(double(from16(out[o0 + c])) - ref.o[o0 + c]);
              bad += !(e <= tol);
              err = std::max(err, std::isnan(e) ? INFINITY : e);
              valid.push_back(out[o0 + c]);
              ++checked;
            }
            const size_t li =
                m.varlen ? size_t(h) * pr.total_q + pr.q_start[b] + i : (size_t(b) * pr.heads_q + h) * pr.max_sq + i;
            empty_rows += ref.lse[li] == -INFINITY;
            const double le = ref.lse[li] == -INFINITY
                                  ? (lse[li] == -INFINITY ? 0 : INFINITY)
                                  : std::fabs(lse[li] - ref.lse[li]) / std::max(1.0, std::fabs(ref.lse[li]));
            lse_err = std::max(lse_err, std::isnan(le) ? INFINITY : le);
          }
      const bool pass = bad == 0 && lse_err <= 1e-3;
      failures += !pass;
      std::printf("%s problem %d (%zu seqs, %ld empty rows) %-5s max|o - ref64| %.3g (tol %.3g), bad %ld of %ld, lse "
                  "rel err %.3g: %s\n",
                  tag.c_str(), shape, pr.sq.size(), empty_rows, names[which], err, tol, bad, checked, lse_err,
                  pass ? "PASS" : "FAIL");
      outputs.push_back(valid);
    }
    long differ = 0;
    for (size_t i = 0; i < outputs[0].size(); ++i)
      differ += outputs[0][i] != outputs[1][i];
    std::printf("%s problem %d mlir vs nvrtc: %ld of %zu outputs differ in bits\n", tag.c_str(), shape, differ,
                outputs[0].size());
    free_device(d);
  }

  if (m.page_size > 0)
    failures += check_far_pages(kernels, names, m, tag, scale);

  // Timing: batch 2, 16 query heads, S = 4096 (varlen: two sequences of 4096; paged: full pages).
  {
    const std::vector<int> s(kTimedBatch, kTimedSeqlen);
    Problem pr = make_problem(m, kTimedBatch, kTimedHeadsQ, s, s, 99, true);
    Device d = to_device(m, pr);
    fj_attention_params p = params_for(m, pr, d, scale);
    double flops = 2.0 * kTimedBatch * kTimedHeadsQ * double(kTimedSeqlen) * kTimedSeqlen * (m.dqk + m.dv);
    if (m.causal)
      flops /= 2;
    if (m.local)
      flops *= double(kWindowLeft + kWindowRight + 1) / kTimedSeqlen;
    CUevent start, stop;
    CK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&stop, CU_EVENT_DEFAULT));
    double tflops[2];
    for (int round = 0; round < 2; ++round) // mlir, nvrtc, then again: the second round is reported
      for (int which = 0; which < 2; ++which) {
        for (int i = 0; i < kWarmupLaunches; ++i)
          launch(kernels[which], m, p);
        CK(cuEventRecord(start, nullptr));
        for (int i = 0; i < kTimedLaunches; ++i)
          launch(kernels[which], m, p);
        CK(cuEventRecord(stop, nullptr));
        CK(cuEventSynchronize(stop));
        float ms = 0;
        CK(cuEventElapsedTime(&ms, start, stop));
        tflops[which] = flops * kTimedLaunches / (ms * 1e-3) / 1e12;
      }
    std::printf("%s timing b%d h%d s%d: mlir %.1f TFLOP/s, nvrtc %.1f TFLOP/s, mlir/nvrtc %.3f\n", tag.c_str(),
                kTimedBatch, kTimedHeadsQ, kTimedSeqlen, tflops[0], tflops[1], tflops[0] / tflops[1]);
    free_device(d);
  }
  for (Kernel &k : kernels)
    CK(cuModuleUnload(k.mod));
  return failures ? 1 : 0;
}
