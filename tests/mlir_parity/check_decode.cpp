// GPU check of the MLIR-built split-K decode kernels (fj_decode_splitk + fj_decode_combine) against
// a float64 reference and against the NVRTC build of the same spec (cubins + plan line from
// make_decode_parity.cpp, via scripts/make-mlir-parity.sh). Host only: driver API, -lcuda, the host
// schedule compiled in from source; no LLVM needed. Run by scripts/gpu-check.sh:
//   g++ -std=c++20 -O2 tests/mlir_parity/check_decode.cpp compiler/splitk_schedule.cpp -I. -Itemplates
//       -I/usr/local/cuda/include -lcuda -o check_decode
//   ./check_decode build-device/mlir-parity-decode/sm90a.d128.bf16.g8.q1
// Each spec runs twice: the real SM count (many units split, states merged by fj_decode_combine)
// and a 1-SM grid (long runs, several pieces per CTA). Outputs and LSE are NaN-poisoned first and
// every element is checked. Pass rule (team): max|ours - ref64| <= 2 * max|naive - ref64| + 1e-5,
// naive = plain attention on the same 16-bit inputs with fp32 accumulation, rounded to the dtype;
// LSE to 1e-3 relative. Prints how many outputs differ in bits between the MLIR and NVRTC kernels.
//
// The .meta line may end with page_size and align_bytes (older metas without them: contiguous,
// 16-byte aligned), then fused_merge (plan constant kFusedMerge; older metas: 0): when 1 the
// decode merges its split units itself and only fj_decode_splitk is launched. Paged: K/V live in
// pages [num_pages, page_size, heads_kv, d] handed out to the sequences in shuffled order through
// the block table; table entries past a sequence's pages name a page of NaNs, and so does every
// element no (valid) key should reach. align_bytes < 16: Q, K, V and O get odd head/row/page
// strides and a base offset of one element, so rows are only 2-byte aligned; the gaps hold NaN too.
#include "tests/mlir_parity/driver_check.hpp"

#include "compiler/splitk_schedule.hpp"
#include "params_decode.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

int main(int argc, char **argv) {
  if (argc < 2) {
    std::printf("usage: %s out/<tag>\n", argv[0]);
    return 1;
  }
  const std::string base = argv[1];
  int threads, smem, block_m, block_n, m_blocks, ctas_per_sm, combine_threads, dqk, dv, group, q_len, causal, local,
      softcap, bf16_i, page_size = 0, align_bytes = 16, fused_merge = 0;
  {
    const std::vector<char> text = parity::read_file(base + ".meta");
    std::istringstream meta(std::string(text.data(), text.size()));
    if (!(meta >> threads >> smem >> block_m >> block_n >> m_blocks >> ctas_per_sm >> combine_threads >> dqk >> dv >>
          group >> q_len >> causal >> local >> softcap >> bf16_i)) {
      std::printf("bad %s.meta\n", base.c_str());
      return 1;
    }
    if (!(meta >> page_size >> align_bytes)) {
      page_size = 0;
      align_bytes = 16;
    } // an older meta line
    if (!(meta >> fused_merge))
      fused_merge = 0;
  }
  const bool paged = page_size > 0, unaligned = align_bytes < 16;
  std::printf("layout: %s, %s\n",
              paged ? ("paged, page " + std::to_string(page_size) + ", shuffled table").c_str() : "contiguous",
              unaligned ? "element-aligned (odd strides, base offset 1)" : "16-byte aligned");
  const bool bf16 = bf16_i != 0;
  auto to16 = [&](float f) { return bf16 ? parity::f32_to_bf16(f) : parity::f32_to_f16(f); };
  auto from16 = [&](uint16_t h) { return bf16 ? parity::bf16_to_f32(h) : parity::f16_to_f32(h); };

  // Problem: batch 3, 4 KV heads, KV lengths with a long, a short and a middle sequence.
  const int batch = 3, heads_kv = 4, heads_q = heads_kv * group;
  const std::vector<int32_t> kv_lens = {9001, 333, 4100};
  const int seqlen_k = 9001;
  const int window_left = local ? 700 : -1, window_right = local ? 0 : -1;
  const float softcap_v = softcap ? 30.f : 0.f;
  const float scale = 1.f / std::sqrt(float(dqk));

  std::mt19937 rng(4321);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> q(size_t(batch) * q_len * heads_q * dqk), k(size_t(batch) * seqlen_k * heads_kv * dqk),
      v(size_t(batch) * seqlen_k * heads_kv * dv);
  for (auto &x : q)
    x = to16(normal(rng) * 2.f); // logits with some spread
  for (auto &x : k)
    x = to16(normal(rng));
  for (auto &x : v)
    x = to16(normal(rng));

  // float64 reference and naive fp32 attention (same 16-bit inputs), O rounded to the dtype
  const size_t o_elems = size_t(batch) * q_len * heads_q * dv, lse_elems = size_t(batch) * heads_q * q_len;
  std::vector<double> ref(o_elems), ref_lse(lse_elems);
  std::vector<float> naive(o_elems);
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < q_len; ++t)
      for (int h = 0; h < heads_q; ++h) {
        const int hk = h / group, kv = kv_lens[b];
        const int diag = t + kv - q_len;
        int lo = 0, hi = kv;
        if (causal)
          hi = std::min(hi, diag + 1);
        if (local) {
          if (window_left >= 0)
            lo = std::max(lo, diag - window_left);
          if (window_right >= 0)
            hi = std::min(hi, diag + window_right + 1);
        }
        const uint16_t *qr = &q[((size_t(b) * q_len + t) * heads_q + h) * dqk];
        std::vector<double> s(std::max(hi - lo, 0));
        std::vector<float> sf(s.size());
        double m = -INFINITY;
        float mf = -INFINITY;
        for (int j = lo; j < hi; ++j) {
          const uint16_t *kr = &k[((size_t(b) * seqlen_k + j) * heads_kv + hk) * dqk];
          double acc = 0;
          float accf = 0;
          for (int d = 0; d < dqk; ++d) {
            acc += double(from16(qr[d])) * from16(kr[d]);
            accf += from16(qr[d]) * from16(kr[d]);
          }
          acc *= scale;
          accf *= scale;
          if (softcap) {
            acc = softcap_v * std::tanh(acc / softcap_v);
            accf = softcap_v * std::tanh(accf / softcap_v);
          }
          s[j - lo] = acc;
          sf[j - lo] = accf;
          m = std::max(m, acc);
          mf = std::max(mf, accf);
        }
        double sum = 0;
        float sumf = 0;
        for (size_t j = 0; j < s.size(); ++j) {
          s[j] = std::exp(s[j] - m);
          sum += s[j];
          sf[j] = std::exp(sf[j] - mf);
          sumf += sf[j];
        }
        ref_lse[(size_t(b) * heads_q + h) * q_len + t] = s.empty() ? -INFINITY : m + std::log(sum);
        for (int d = 0; d < dv; ++d) {
          double acc = 0;
          float accf = 0;
          for (int j = lo; j < hi; ++j) {
            const float vv = from16(v[((size_t(b) * seqlen_k + j) * heads_kv + hk) * dv + d]);
            acc += s[j - lo] * vv;
            accf += sf[j - lo] * vv;
          }
          const size_t i = ((size_t(b) * q_len + t) * heads_q + h) * dv + d;
          ref[i] = s.empty() ? 0 : acc / sum;
          naive[i] = s.empty() ? 0.f : from16(to16(accf / sumf));
        }
      }
  double naive_err = 0;
  for (size_t i = 0; i < o_elems; ++i)
    naive_err = std::max(naive_err, std::fabs(naive[i] - ref[i]));
  const double tol = 2 * naive_err + 1e-5;

  // Device layouts. Element (b, row, h, d) of a tensor sits at offset + b * batch + row * row_stride +
  // h * head + d; paged K/V put (page, slot) where (b, row) is: page * page_stride + slot * row_stride.
  struct Layout {
    long long offset, batch, row, head, page;
    size_t elems;
  };
  constexpr uint16_t kNan16 = 0x7fff; // NaN as bf16 and as fp16
  const int pad = unaligned ? 1 : 0;  // odd extra elements per head / row / page / batch
  auto dense = [&](int rows, int heads, int d) {
    Layout l{};
    l.offset = pad;
    l.head = d + pad;
    l.row = heads * l.head + 3 * pad;
    l.batch = rows * l.row + 5 * pad;
    l.elems = size_t(l.offset + batch * l.batch);
    return l;
  };
  // Paging: each sequence's pages are drawn from a shuffled pool; page `num_pages` is the NaN page
  // that the table's unused entries name.
  const int max_pages_per_seq = paged ? (seqlen_k + page_size - 1) / page_size : 0;
  int num_pages = 0;
  std::vector<int32_t> table(size_t(batch) * std::max(max_pages_per_seq, 1), 0);
  std::vector<std::pair<int, int>> page_owner; // page -> (sequence, page index within it)
  if (paged) {
    for (int b = 0; b < batch; ++b)
      num_pages += (kv_lens[b] + page_size - 1) / page_size;
    std::vector<int32_t> pool(num_pages);
    for (int i = 0; i < num_pages; ++i)
      pool[i] = i;
    std::shuffle(pool.begin(), pool.end(), rng);
    page_owner.assign(num_pages, {-1, -1});
    int next = 0;
    for (int b = 0; b < batch; ++b)
      for (int i = 0; i < max_pages_per_seq; ++i) {
        const bool used = i < (kv_lens[b] + page_size - 1) / page_size;
        table[size_t(b) * max_pages_per_seq + i] = used ? pool[next] : num_pages;
        if (used)
          page_owner[pool[next++]] = {b, i};
      }
  }
  auto kv_layout = [&](int d) {
    if (!paged)
      return dense(seqlen_k, heads_kv, d);
    Layout l{};
    l.offset = pad;
    l.head = d + pad;
    l.row = heads_kv * l.head + 3 * pad;
    l.page = page_size * l.row + pad;
    l.batch = 0; // the block table picks the pages
    l.elems = size_t(l.offset + (num_pages + 1) * l.page);
    return l;
  };
  const Layout lq = dense(q_len, heads_q, dqk), lo = dense(q_len, heads_q, dv), lk = kv_layout(dqk), lv = kv_layout(dv);
  // Scatters the logical [batch, rows, heads, d] tensor into its layout; everything else is NaN.
  auto place = [&](const std::vector<uint16_t> &logical, const Layout &l, int rows, int heads, int d, bool kv) {
    std::vector<uint16_t> out(l.elems, kNan16);
    for (int b = 0; b < batch; ++b)
      for (int r = 0; r < (kv ? kv_lens[b] : rows); ++r) {
        const long long at =
            kv && paged ? table[size_t(b) * max_pages_per_seq + r / page_size] * l.page + (r % page_size) * l.row
                        : b * l.batch + r * l.row;
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < d; ++i)
            out[size_t(l.offset + at + h * l.head + i)] = logical[((size_t(b) * rows + r) * heads + h) * d + i];
      }
    return out;
  };
  const std::vector<uint16_t> q_dev = place(q, lq, q_len, heads_q, dqk, false),
                              k_dev = place(k, lk, seqlen_k, heads_kv, dqk, true),
                              v_dev = place(v, lv, seqlen_k, heads_kv, dv, true);
  // The checker's own check: K and V read back the way the kernel addresses them (KvSource of
  // kernels/decode/copies.cuh: the page from the table, then page * page_stride + slot * row + head * head)
  // give the logical tensors; Q likewise.
  {
    long mismatches = 0;
    auto check_kv = [&](const std::vector<uint16_t> &dev, const std::vector<uint16_t> &logical, const Layout &l,
                        int d) {
      for (int b = 0; b < batch; ++b)
        for (int j = 0; j < kv_lens[b]; ++j)
          for (int h = 0; h < heads_kv; ++h) {
            const long long row = paged ? (long long)table[size_t(b) * max_pages_per_seq + j / page_size] * l.page +
                                              (long long)(j % page_size) * l.row
                                        : b * l.batch + (long long)j * l.row;
            for (int i = 0; i < d; ++i)
              mismatches += dev[size_t(l.offset + row + h * l.head + i)] !=
                            logical[((size_t(b) * seqlen_k + j) * heads_kv + h) * d + i];
          }
    };
    check_kv(k_dev, k, lk, dqk);
    check_kv(v_dev, v, lv, dv);
    for (int b = 0; b < batch; ++b)
      for (int t = 0; t < q_len; ++t)
        for (int h = 0; h < heads_q; ++h)
          for (int i = 0; i < dqk; ++i)
            mismatches += q_dev[size_t(lq.offset + b * lq.batch + t * lq.row + h * lq.head + i)] !=
                          q[((size_t(b) * q_len + t) * heads_q + h) * dqk + i];
    if (paged) { // every page is used once, and the table stays inside [0, num_pages]
      std::vector<int> uses(num_pages + 1, 0);
      for (int32_t page : table)
        mismatches += page < 0 || page > num_pages, ++uses[std::clamp(page, 0, num_pages)];
      for (int i = 0; i < num_pages; ++i)
        mismatches += uses[i] != 1;
    }
    std::printf("layout self-check: %s (%d pages, %ld mismatches)\n", mismatches ? "FAIL" : "ok", num_pages,
                mismatches);
    if (mismatches)
      return 1;
  }
  auto o_at = [&](size_t logical) { // logical index of [batch, q_len, heads_q, dv] -> device element
    const size_t i = logical % dv, h = logical / dv % heads_q, t = logical / dv / heads_q % q_len,
                 b = logical / dv / heads_q / q_len;
    return size_t(lo.offset + b * lo.batch + t * lo.row + h * lo.head + i);
  };

  const int sms = parity::open_device();
  CUdeviceptr d_q, d_k, d_v, d_o, d_lse, d_lens, d_table;
  CK(cuMemAlloc(&d_q, q_dev.size() * 2));
  CK(cuMemAlloc(&d_k, k_dev.size() * 2));
  CK(cuMemAlloc(&d_v, v_dev.size() * 2));
  CK(cuMemAlloc(&d_o, lo.elems * 2));
  CK(cuMemAlloc(&d_lse, lse_elems * 4));
  CK(cuMemAlloc(&d_lens, batch * 4));
  CK(cuMemAlloc(&d_table, table.size() * 4));
  CK(cuMemcpyHtoD(d_q, q_dev.data(), q_dev.size() * 2));
  CK(cuMemcpyHtoD(d_k, k_dev.data(), k_dev.size() * 2));
  CK(cuMemcpyHtoD(d_v, v_dev.data(), v_dev.size() * 2));
  CK(cuMemcpyHtoD(d_lens, kv_lens.data(), batch * 4));
  CK(cuMemcpyHtoD(d_table, table.data(), table.size() * 4));

  int failures = 0;
  for (int grid_sms : {sms, 1}) {
    flashjit::SplitKShape shape;
    shape.num_sms = grid_sms;
    shape.ctas_per_sm = ctas_per_sm;
    shape.block_m = block_m;
    shape.block_n = block_n;
    shape.m_blocks = m_blocks;
    shape.head_dim_v = dv;
    shape.heads_kv = heads_kv;
    shape.max_batch = batch;
    flashjit::SplitKLayout layout;
    std::string error;
    if (!flashjit::splitk_layout(shape, &layout, &error)) {
      std::printf("layout: %s\n", error.c_str());
      return 1;
    }
    flashjit::SplitKProblem problem;
    problem.seqlens_k = kv_lens.data();
    problem.seqlen_k = seqlen_k;
    problem.batch = batch;
    problem.q_len = q_len;
    problem.window_left = window_left;
    std::vector<char> host(layout.int_bytes);
    flashjit::SplitKSchedule sched;
    if (!flashjit::splitk_schedule(shape, layout, problem, host.data(), host.size(), &sched, &error)) {
      std::printf("schedule: %s\n", error.c_str());
      return 1;
    }
    CUdeviceptr ws;
    CK(cuMemAlloc(&ws, layout.total_bytes));
    CK(cuMemsetD32(ws, 0x7fc00000, layout.total_bytes / 4)); // partial states start as NaN too
    CK(cuMemcpyHtoD(ws, host.data(), host.size()));

    std::vector<std::vector<uint16_t>> outputs;
    for (const char *which : {"mlir", "nvrtc"}) {
      std::vector<char> cubin = parity::read_file(base + "." + which + ".cubin");
      if (cubin.empty()) {
        std::printf("%s: no cubin at %s.%s.cubin\n", which, base.c_str(), which);
        return 1;
      }
      CUmodule mod;
      CK(cuModuleLoadData(&mod, cubin.data()));
      CUfunction fn, fc;
      CK(cuModuleGetFunction(&fn, mod, "fj_decode_splitk"));
      CK(cuModuleGetFunction(&fc, mod, "fj_decode_combine"));
      CK(cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem));
      CK(cuMemsetD16(d_o, kNan16, lo.elems));
      CK(cuMemsetD32(d_lse, 0x7fc00000, lse_elems));
      fj_decode_params p{};
      fj_attention_params &a = p.attn;
      auto tensor = [](CUdeviceptr ptr, const Layout &l) {
        return fj_tensor_ref{reinterpret_cast<uint16_t *>(ptr) + l.offset, l.batch, l.row, l.head};
      };
      a.q = tensor(d_q, lq);
      a.k = tensor(d_k, lk);
      a.v = tensor(d_v, lv);
      a.o = tensor(d_o, lo);
      if (paged) {
        a.paged.block_table = reinterpret_cast<const fj_i32 *>(d_table);
        a.paged.max_pages_per_seq = max_pages_per_seq;
        a.paged.page_size = page_size;
        a.paged.page_stride_k = lk.page;
        a.paged.page_stride_v = lv.page;
      }
      a.maybe_lse = reinterpret_cast<float *>(d_lse);
      a.maybe_seqlens_k = reinterpret_cast<const fj_i32 *>(d_lens);
      a.batch = batch;
      a.seqlen_q = q_len;
      a.seqlen_k = seqlen_k;
      a.total_q = batch * q_len;
      a.heads_q = heads_q;
      a.heads_kv = heads_kv;
      a.group = group;
      a.window_left = window_left;
      a.window_right = window_right;
      a.scale = scale;
      a.scale_log2 = scale * 1.4426950408889634f;
      a.softcap = softcap_v;
      a.softcap_inv = softcap ? 1.f / softcap_v : 0.f;
      char *w = reinterpret_cast<char *>(ws);
      a.maybe_partial_o = reinterpret_cast<float *>(w + layout.partial_o_offset);
      a.maybe_partial_lse = reinterpret_cast<float *>(w + layout.partial_lse_offset);
      p.header = reinterpret_cast<const fj_decode_header *>(w + layout.header_offset);
      p.slot_begin = reinterpret_cast<const fj_i32 *>(w + layout.slot_offset);
      p.work = reinterpret_cast<const fj_decode_work *>(w + layout.work_offset);
      p.merges = reinterpret_cast<const fj_decode_merge *>(w + layout.merge_offset);
      p.m_blocks = m_blocks;
      void *args[] = {&p};
      CK(cuLaunchKernel(fn, layout.grid, 1, 1, threads, 1, 1, smem, nullptr, args, nullptr));
      if (!fused_merge) // fused: the decode grid merged its split units (counters zero again)
        CK(cuLaunchKernel(fc, layout.grid, 1, 1, combine_threads, 1, 1, 0, nullptr, args,
                          nullptr)); // stream order, no PDL
      CK(cuCtxSynchronize());
      std::vector<uint16_t> out_dev(lo.elems), out(o_elems);
      std::vector<float> olse(lse_elems);
      CK(cuMemcpyDtoH(out_dev.data(), d_o, lo.elems * 2));
      CK(cuMemcpyDtoH(olse.data(), d_lse, lse_elems * 4));
      for (size_t i = 0; i < o_elems; ++i)
        out[i] = out_dev[o_at(i)];
      long gap_writes = 0; // elements between the rows must keep their NaN
      std::vector<char> is_out(lo.elems, 0);
      for (size_t i = 0; i < o_elems; ++i)
        is_out[o_at(i)] = 1;
      for (size_t i = 0; i < lo.elems; ++i)
        gap_writes += !is_out[i] && out_dev[i] != kNan16;
      double err = 0, lse_err = 0;
      long bad = 0;
      for (size_t i = 0; i < o_elems; ++i) {
        const double e = std::fabs(double(from16(out[i])) - ref[i]);
        if (!(e <= tol))
          ++bad;
        err = std::max(err, std::isnan(e) ? INFINITY : e);
      }
      for (size_t i = 0; i < lse_elems; ++i) {
        const double le = ref_lse[i] == -INFINITY
                              ? (olse[i] == -INFINITY ? 0 : INFINITY)
                              : std::fabs(olse[i] - ref_lse[i]) / std::max(1.0, std::fabs(ref_lse[i]));
        lse_err = std::max(lse_err, std::isnan(le) ? INFINITY : le);
      }
      const bool pass = bad == 0 && lse_err <= 1e-3 && gap_writes == 0;
      if (gap_writes)
        std::printf("  %ld writes outside the O rows\n", gap_writes);
      if (!pass) { // where: the first few bad LSE rows (row index = its place in the LSE tensor)
        int shown = 0;
        for (size_t i = 0; i < lse_elems && shown < 6; ++i)
          if (!(std::fabs(olse[i] - ref_lse[i]) <= 1e-3 * std::max(1.0, std::fabs(ref_lse[i])))) {
            std::printf("  lse[%zu] ours %.6g ref %.6g\n", i, olse[i], ref_lse[i]);
            ++shown;
          }
        shown = 0;
        for (size_t i = 0; i < o_elems && shown < 4; ++i)
          if (!(std::fabs(double(from16(out[i])) - ref[i]) <= tol)) {
            std::printf("  o[%zu] ours %.6g ref %.6g\n", i, double(from16(out[i])), ref[i]);
            ++shown;
          }
        for (int c = 0; c < layout.grid && c < 4; ++c) {
          const int *slots = reinterpret_cast<const int *>(host.data() + layout.slot_offset);
          const int *work = reinterpret_cast<const int *>(host.data() + layout.work_offset);
          for (int i = slots[c]; i < slots[c + 1]; ++i)
            std::printf("  cta %d piece %d: unit %d keys [%d, %d) state %d\n", c, i, work[4 * i], work[4 * i + 1],
                        work[4 * i + 2], work[4 * i + 3]);
        }
      }
      failures += !pass;
      std::printf("grid %4d (%d merges, %d states) %-6s max|o - ref64| %.3g (tol %.3g, naive %.3g), bad %ld, lse rel "
                  "err %.3g: %s\n",
                  layout.grid, sched.num_merges, sched.num_states, which, err, tol, naive_err, bad, lse_err,
                  pass ? "PASS" : "FAIL");
      outputs.push_back(out);
      CK(cuModuleUnload(mod));
    }
    long differ = 0;
    for (size_t i = 0; i < o_elems; ++i)
      differ += outputs[0][i] != outputs[1][i];
    std::printf("grid %4d mlir vs nvrtc: %ld of %zu outputs differ in bits\n", layout.grid, differ, o_elems);
    CK(cuMemFree(ws));
  }
  return failures ? 1 : 0;
}
