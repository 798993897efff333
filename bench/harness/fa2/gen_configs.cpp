// Scratch (fa2perf): writes one cfg_N.cu per tested KernelConfig (planned by plan_fa2_tuned) plus
// registry.inc, for harness.cu. "wide" = Fa2Tuning::rows_per_warp = 32; "default" = plan_fa2 as shipped.
#include "compiler/plans/fa2_plan.hpp"
#include "compiler/planner.hpp"
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
using namespace flashjit;

struct C {
  int rows; // 0 = default plan, 32 = wide
  int dq, dv, bf16;
  bool causal, local, softcap, varlen;
  int page, align;
  bool perf;
  int bm = 0, bn = 0, stages = 0; // tuning overrides (0 = planner's choice)
  int plan_sm = 90;
  int sub = 0; // Fa2Tuning::sub_block_n
};

int main() {
  std::vector<C> cs;
  // Correctness of the 32-row configuration: every head dim class, both dtypes, causal or not.
  const int dims[][2] = {{8, 8}, {40, 40}, {64, 64}, {72, 72}, {80, 80}, {96, 96}, {128, 128}, {192, 128}, {256, 256}};
  for (auto &d : dims)
    for (int bf : {0, 1}) {
      cs.push_back({0, d[0], d[1], bf, false, false, false, false, 0, 16, false});
      cs.push_back({0, d[0], d[1], bf, true, false, false, false, 0, 16, false});
    }
  // windows (alone / with causal), softcap, varlen, paged (1, 16, 3), unaligned, GQA (every problem)
  cs.push_back({0, 64, 64, 1, false, true, false, false, 0, 16, false});
  cs.push_back({0, 128, 128, 0, true, true, false, false, 0, 16, false});
  cs.push_back({0, 128, 128, 1, false, false, true, false, 0, 16, false});
  cs.push_back({0, 80, 80, 0, true, false, true, false, 0, 16, false});
  cs.push_back({0, 64, 64, 1, true, false, false, true, 0, 16, false});
  cs.push_back({0, 128, 128, 0, false, false, false, true, 0, 16, false});
  cs.push_back({0, 72, 72, 1, true, true, true, true, 0, 16, false});
  cs.push_back({0, 64, 64, 1, false, false, false, false, 1, 16, false});
  cs.push_back({0, 128, 128, 1, true, false, false, false, 16, 16, false});
  cs.push_back({0, 128, 128, 0, true, false, false, true, 16, 16, false});
  cs.push_back({0, 80, 80, 0, false, true, false, true, 3, 16, false});
  cs.push_back({0, 72, 72, 0, false, false, false, false, 0, 2, false});
  cs.push_back({0, 128, 128, 1, true, false, false, false, 0, 2, false});
  cs.push_back({0, 192, 128, 0, true, true, false, true, 16, 2, false});
  // the single-buffer schedule and 64-row tiles (2 warps) with 32 rows, as smaller GPUs would plan
  cs.push_back({32, 128, 128, 1, true, false, false, false, 0, 16, false, 0, 0, 0, 86});
  cs.push_back({32, 64, 64, 0, false, true, true, false, 0, 16, false, 64, 64, 1});
  cs.push_back({32, 96, 96, 1, true, false, false, true, 0, 16, false, 64, 32, 2});

  // Timing (bf16, S = 4096, B*S = 16384, heads*d = 2048): the default plan against the budget tile
  // (dv + n <= 144) and the sub-block variant of the same key block.
  for (int d : {64, 80, 128})
    for (bool causal : {false, true}) {
      cs.push_back({0, d, d, 1, causal, false, false, false, 0, 16, true}); // default plan
      const int budget_n = std::max(32, std::min(128, (144 - d) / 16 * 16));
      cs.push_back({32, d, d, 1, causal, false, false, false, 0, 16, true, 0, budget_n, 2});
    }
  cs.push_back({32, 128, 128, 1, false, false, false, false, 0, 16, true, 0, 64, 2, 90, 32}); // d128 128x64 in 2 steps
  cs.push_back({32, 64, 64, 1, false, false, false, false, 0, 16, true, 0, 128, 2, 90, 64});  // d64 128x128 in 2 steps
  std::ofstream reg("registry.inc");
  for (size_t n = 0; n < cs.size(); ++n) {
    const C &c = cs[n];
    KernelSpec s;
    s.arch = {c.plan_sm, c.plan_sm == 90};
    s.dtype = c.bf16 ? FLASHJIT_BF16 : FLASHJIT_FP16;
    s.head_dim_qk = c.dq; s.head_dim_v = c.dv; s.causal = c.causal; s.local = c.local; s.softcap = c.softcap;
    s.varlen = c.varlen; s.page_size = c.page; s.align_bytes = c.align;
    Fa2Tuning tuning;
    tuning.rows_per_warp = c.rows; tuning.block_m = c.bm; tuning.block_n = c.bn; tuning.stages = c.stages; tuning.sub_block_n = c.sub;
    Plan p; std::string why;
    if (!plan_fa2_tuned(s, tuning, &p, &why)) { fprintf(stderr, "config %zu declined: %s\n", n, why.c_str()); return 1; }
    std::ostringstream o;
    auto i = [&](const char *nm, long long v) { o << "  static constexpr int " << nm << " = " << v << ";\n"; };
    auto b = [&](const char *nm, bool v) { o << "  static constexpr bool " << nm << " = " << (v ? "true" : "false") << ";\n"; };
    o << "#define KernelConfig KernelConfig_" << n << "\n#define fj_fa2_prefill fj_fa2_prefill_" << n << "\n";
    o << "struct KernelConfig {\n";
    i("kArch", 90); i("kDType", c.bf16); i("kHeadDimQK", c.dq); i("kHeadDimV", c.dv); b("kCausal", c.causal);
    b("kLocal", c.local); b("kSoftcap", c.softcap); b("kVarlen", c.varlen); i("kPageSize", c.page); i("kGqaGroup", 0);
    i("kQLen", 0); b("kAligned16", c.align >= 16); i("kThreads", p.threads); i("kSmemBytes", p.smem_bytes);
    for (auto &k : p.constants) { if (k.is_bool) b(k.name.c_str(), k.value); else i(k.name.c_str(), k.value); }
    o << "};\n#include \"kernels/fa2_prefill.cuh\"\n#include \"harness_api.h\"\n";
    o << "static void launch(const fj_attention_params &p, cudaStream_t st) {\n"
      << "  static bool once = [] { cudaFuncSetAttribute(fj_fa2_prefill_" << n
      << ", cudaFuncAttributeMaxDynamicSharedMemorySize, " << p.smem_bytes << "); return true; }();\n  (void)once;\n"
      << "  fj_fa2_prefill_" << n << "<<<dim3(p.num_m_blocks, p.heads_q, p.batch), " << p.threads << ", " << p.smem_bytes
      << ", st>>>(p);\n}\n";
    char name[256];
    snprintf(name, sizeof name, "%s plan%d d%d/%d %s%s%s%s%s pg%d al%d m%dn%dk%llds%dr%lldt%d", c.rows ? "WIDE" : "DFLT",
             c.plan_sm, c.dq, c.dv, c.bf16 ? "bf16" : "fp16", c.causal ? " causal" : "", c.local ? " local" : "",
             c.softcap ? " softcap" : "", c.varlen ? " varlen" : "", c.page, c.align, p.block_m, p.block_n,
             (long long)p.constant("kSubBlockN"), p.stages,
             (long long)p.constant("kRowsPerWarp"), p.threads);
    o << "extern const CfgInfo cfg_info_" << n << " = {\"" << name << "\", " << c.dq << ", " << c.dv << ", " << c.bf16
      << ", " << c.causal << ", " << c.local << ", " << c.softcap << ", " << c.varlen << ", " << c.page << ", "
      << c.align << ", " << p.block_m << ", " << c.perf << ", launch};\n";
    std::ofstream(("cfg_" + std::to_string(n) + ".cu").c_str()) << o.str();
    reg << "X(" << n << ")\n";
  }
  printf("%zu configs\n", cs.size());
}
