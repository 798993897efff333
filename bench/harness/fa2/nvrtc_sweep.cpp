// Scratch (fa2perf): NVRTC sweeps of the fa2 kernel with plan_fa2_tuned, no GPU needed.
//   nvrtc_sweep wide      32 rows/warp: sm80/86/89/90a x d8..256 step 8 (+192v128) x fp16/bf16 x causal/full
//   nvrtc_sweep features  32 rows/warp: window+softcap+varlen+paged, paged batch, unaligned, at d64/80/128
//   nvrtc_sweep same      default plans of both lists: SASS from the original templates (orig_templates/)
//                         vs the current ones, instruction for instruction (sass_norm.py)
#include "compiler/plans/fa2_plan.hpp"
#include "compiler/planner.hpp"
#include <nvrtc.h>
#include <atomic>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace flashjit;
namespace fs = std::filesystem;

struct Headers {
  std::vector<std::string> names, texts;
  std::vector<const char *> n, t;
  explicit Headers(const std::string &root) {
    for (auto &e : fs::recursive_directory_iterator(root)) {
      if (!e.is_regular_file()) continue;
      std::ifstream f(e.path()); std::stringstream ss; ss << f.rdbuf();
      names.push_back(fs::relative(e.path(), root).string()); texts.push_back(ss.str());
    }
    for (size_t k = 0; k < names.size(); ++k) { n.push_back(names[k].c_str()); t.push_back(texts[k].c_str()); }
  }
};

static std::string render(const KernelSpec &s, const Plan &p) {
  std::ostringstream o;
  auto i = [&](const char *n, long long v) { o << "  static constexpr int " << n << " = " << v << ";\n"; };
  auto b = [&](const char *n, bool v) { o << "  static constexpr bool " << n << " = " << (v ? "true" : "false") << ";\n"; };
  o << "struct KernelConfig {\n";
  i("kArch", s.arch.sm); i("kDType", s.dtype == FLASHJIT_FP16 ? 0 : 1); i("kHeadDimQK", s.head_dim_qk);
  i("kHeadDimV", s.head_dim_v); b("kCausal", s.causal); b("kLocal", s.local); b("kSoftcap", s.softcap);
  b("kVarlen", s.varlen); i("kPageSize", s.page_size); i("kGqaGroup", s.gqa_group); i("kQLen", s.q_len);
  b("kAligned16", s.align_bytes >= 16); i("kThreads", p.threads); i("kSmemBytes", p.smem_bytes);
  for (auto &c : p.constants) { if (c.is_bool) b(c.name.c_str(), c.value); else i(c.name.c_str(), c.value); }
  o << "};\n#include \"kernels/fa2_prefill.cuh\"\n";
  return o.str();
}

struct Out { bool ok; int regs = -1; int spill = -1; std::string log; std::string cubin; std::string ptx; };

static Out compile(const Headers &h, const KernelSpec &s, const Plan &p) {
  Out out{};
  std::string src = render(s, p);
  nvrtcProgram prog;
  nvrtcCreateProgram(&prog, src.c_str(), "fa2.cu", (int)h.n.size(), h.t.data(), h.n.data());
  std::string arch = "--gpu-architecture=sm_" + std::to_string(s.arch.sm) + (s.arch.arch_specific ? "a" : "");
  const char *opts[] = {arch.c_str(), "-std=c++17", "--ptxas-options=-v", "-default-device"};
  out.ok = nvrtcCompileProgram(prog, 4, opts) == NVRTC_SUCCESS;
  size_t ls; nvrtcGetProgramLogSize(prog, &ls); out.log.assign(ls, 0); nvrtcGetProgramLog(prog, out.log.data());
  if (out.ok) { size_t cs; nvrtcGetCUBINSize(prog, &cs); out.cubin.assign(cs, 0); nvrtcGetCUBIN(prog, out.cubin.data());
    size_t ps; nvrtcGetPTXSize(prog, &ps); out.ptx.assign(ps, 0); nvrtcGetPTX(prog, out.ptx.data()); }
  nvrtcDestroyProgram(&prog);
  auto pos = out.log.find("Used ");
  if (pos != std::string::npos) out.regs = atoi(out.log.c_str() + pos + 5);
  pos = out.log.find("bytes spill stores");
  if (pos != std::string::npos) { auto b = out.log.rfind(',', pos); out.spill = atoi(out.log.c_str() + b + 1); }
  return out;
}

struct Case { KernelSpec spec; };

static KernelSpec spec_of(int sm, int dq, int dv, flashjit_dtype dt, bool causal) {
  KernelSpec s; s.arch = {sm, sm == 90}; s.dtype = dt; s.head_dim_qk = dq; s.head_dim_v = dv; s.causal = causal;
  s.align_bytes = 16;
  return s;
}

static std::string describe(const KernelSpec &s, const Plan &p) {
  char b[256];
  snprintf(b, sizeof b, "sm%d%s d%d/%d %s%s%s%s%s pg%d al%d | m%d n%d s%d rows%lld t%d smem=%d", s.arch.sm,
           s.arch.arch_specific ? "a" : "", s.head_dim_qk, s.head_dim_v, s.dtype == FLASHJIT_FP16 ? "fp16" : "bf16",
           s.causal ? " causal" : "", s.local ? " local" : "", s.softcap ? " softcap" : "", s.varlen ? " varlen" : "",
           s.page_size, s.align_bytes, p.block_m, p.block_n, p.stages, (long long)p.constant("kRowsPerWarp"), p.threads,
           p.smem_bytes);
  return b;
}

int main(int argc, char **argv) {
  const std::string mode = argc > 1 ? argv[1] : "wide";
  const int jobs = argc > 2 ? atoi(argv[2]) : 2;
  const std::string here = fs::path(argv[0]).parent_path().string();
  Headers cur("/work/main/templates");
  Headers orig(here + "/orig_templates");
  std::vector<KernelSpec> specs;
  const int sms[] = {80, 86, 89, 90};
  if (mode == "wide" || mode == "same") {
    for (int sm : sms)
      for (int d = 8; d <= 256; d += 8)
        for (auto dt : {FLASHJIT_FP16, FLASHJIT_BF16})
          for (bool causal : {false, true}) specs.push_back(spec_of(sm, d, d, dt, causal));
    for (int sm : sms)
      for (auto dt : {FLASHJIT_FP16, FLASHJIT_BF16}) specs.push_back(spec_of(sm, 192, 128, dt, true));
  }
  if (mode == "features" || mode == "same") {
    for (int sm : sms)
      for (int d : {64, 80, 128})
        for (auto dt : {FLASHJIT_FP16, FLASHJIT_BF16}) {
          KernelSpec a = spec_of(sm, d, d, dt, true); a.local = a.softcap = a.varlen = true; a.page_size = 16;
          KernelSpec b = spec_of(sm, d, d, dt, false); b.local = true; b.varlen = true; b.page_size = 1; b.align_bytes = 2;
          KernelSpec c = spec_of(sm, d, d, dt, true); c.page_size = 3; c.softcap = true;
          KernelSpec e = spec_of(sm, d, d, dt, false); e.varlen = true;
          specs.insert(specs.end(), {a, b, c, e});
        }
  }
  if (argc > 3) { // every k-th spec only (quick checks)
    const size_t stride = (size_t)atoi(argv[3]);
    std::vector<KernelSpec> some;
    for (size_t i = 0; i < specs.size(); i += stride) some.push_back(specs[i]);
    specs.swap(some);
  }
  Fa2Tuning tuning;
  if (mode != "same") tuning.rows_per_warp = 32;
  std::atomic<size_t> next{0};
  std::atomic<int> failures{0}, spills_small{0}, identical{0};
  std::vector<std::string> lines(specs.size());
  auto worker = [&] {
    for (size_t i; (i = next++) < specs.size();) {
      const KernelSpec &s = specs[i];
      Plan plan; std::string why;
      if (!plan_fa2_tuned(s, tuning, &plan, &why)) { lines[i] = "DECLINED " + why; ++failures; continue; }
      Out a = compile(cur, s, plan);
      std::string line = describe(s, plan) + " | regs " + std::to_string(a.regs) + " spill " + std::to_string(a.spill);
      if (!a.ok) { line += " | FAIL\n" + a.log; ++failures; }
      const bool small = std::max(s.head_dim_qk, s.head_dim_v) <= 128;
      if (a.ok && small && a.spill != 0) { line += " | SPILL"; ++spills_small; }
      if (mode == "same" && a.ok) {
        Out b = compile(orig, s, plan);
        // Cubins embed more than code (the NVRTC build hash); compare the SASS text instead.
        fs::create_directories(here + "/cubins");
        const std::string stem = here + "/cubins/" + std::to_string(i);
        std::ofstream(stem + ".cur.cubin", std::ios::binary) << a.cubin;
        std::ofstream(stem + ".orig.cubin", std::ios::binary) << b.cubin;
        std::ofstream(stem + ".cur.ptx") << a.ptx;
        std::ofstream(stem + ".orig.ptx") << b.ptx;
        const std::string norm = "python3 " + here + "/sass_norm.py ";
        const std::string cmd = norm + stem + ".cur.cubin > " + stem + ".cur.sass && " + norm + stem +
                                ".orig.cubin > " + stem + ".orig.sass && cmp -s " + stem + ".cur.sass " + stem +
                                ".orig.sass";
        const bool same = b.ok && std::system(cmd.c_str()) == 0;
        line += same ? " | SASS identical" : " | SASS DIFFERS (orig regs " + std::to_string(b.regs) + ")";
        if (same) ++identical; else ++failures;
      }
      lines[i] = line;
    }
  };
  std::vector<std::thread> pool;
  for (int j = 0; j < jobs; ++j) pool.emplace_back(worker);
  for (auto &t : pool) t.join();
  for (auto &l : lines) printf("%s\n", l.c_str());
  printf("SUMMARY mode=%s cases=%zu failures=%d spills(d<=128)=%d identical=%d\n", mode.c_str(), specs.size(),
         failures.load(), spills_small.load(), identical.load());
  return failures != 0 || spills_small != 0;
}
