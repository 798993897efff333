// Scratch: plan + render + NVRTC-compile decode specs, templates fed from memory. Writes cubins and a
// metadata line per spec; prints registers / spills.
//   gen <outdir> <matrix|harness>
#include "compiler/codegen.hpp"
#include "compiler/planner.hpp"
#include "compiler/plans/decode_plan.hpp"

#include <nvrtc.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <utility>
#include <vector>

namespace fs = std::filesystem;
using namespace flashjit;

static std::vector<std::pair<std::string, std::string>> load_templates(const fs::path &root) {
  std::vector<std::pair<std::string, std::string>> out;
  for (auto &e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file())
      continue;
    auto ext = e.path().extension().string();
    if (ext != ".cuh" && ext != ".h")
      continue;
    std::ifstream f(e.path());
    std::stringstream ss;
    ss << f.rdbuf();
    out.push_back({fs::relative(e.path(), root).string(), ss.str()});
  }
  return out;
}

struct Result {
  bool ok;
  std::string log;
  std::vector<char> cubin;
};

static Result compile(const std::string &src, const Arch &arch,
                      const std::vector<std::pair<std::string, std::string>> &tpl) {
  std::vector<const char *> names, texts;
  for (auto &t : tpl) {
    names.push_back(t.first.c_str());
    texts.push_back(t.second.c_str());
  }
  nvrtcProgram prog;
  nvrtcCreateProgram(&prog, src.c_str(), "gen.cu", (int)tpl.size(), texts.data(), names.data());
  std::string target = "--gpu-architecture=" + arch.nvrtc_target();
  const char *opts[] = {target.c_str(), "-std=c++17", "--device-as-default-execution-space", "--ptxas-options=-v"};
  nvrtcResult r = nvrtcCompileProgram(prog, 4, opts);
  size_t n;
  nvrtcGetProgramLogSize(prog, &n);
  std::string log(n, 0);
  nvrtcGetProgramLog(prog, log.data());
  Result res{r == NVRTC_SUCCESS, log, {}};
  if (res.ok) {
    nvrtcGetCUBINSize(prog, &n);
    res.cubin.resize(n);
    nvrtcGetCUBIN(prog, res.cubin.data());
  }
  nvrtcDestroyProgram(&prog);
  return res;
}

// Per-function register / spill lines from the ptxas -v log.
static std::string summarize(const std::string &log) {
  std::regex fn(R"(Compiling entry function '(\w+)')");
  std::regex regs(R"(Used (\d+) registers)");
  std::regex spill(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
  std::istringstream in(log);
  std::string line, cur, out;
  std::string spills;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, fn))
      cur = m[1];
    else if (std::regex_search(line, m, spill))
      spills = m[1].str() + "/" + m[2].str();
    else if (std::regex_search(line, m, regs))
      out += " " + cur + "=" + m[1].str() + "r(spill " + spills + ")";
  }
  return out;
}

int main(int argc, char **argv) {
  fs::path out = argc > 1 ? argv[1] : "cubins";
  std::string mode = argc > 2 ? argv[2] : "matrix";
  fs::create_directories(out);
  auto tpl = load_templates(fs::path(FLASHJIT_SOURCE_DIR) / "templates");
  std::vector<KernelSpec> specs;
  std::vector<std::string> tags;
  std::vector<std::string> extras; // per harness spec: "NAME=VALUE,..." plan constants to set; TL=1: timeline build;
                                   // ONEPASS=1: one-pass merge build; WARPS / WARPKEYS: DecodeTuning;
                                   // TMAKV=1: K/V tiles by TMA
  auto base = [](int sm, flashjit_dtype dt, int dqk, int dv, int group, int qlen, int page) {
    KernelSpec s;
    s.op = Op::decode;
    s.arch = Arch{sm, sm == 90};
    s.dtype = dt;
    s.head_dim_qk = dqk;
    s.head_dim_v = dv;
    s.gqa_group = group;
    s.q_len = qlen;
    s.page_size = page;
    return s;
  };
  const int only_sm = argc > 3 ? atoi(argv[3]) : 0;
  if (mode == "matrix") {
    for (int sm : {80, 90})
      if (only_sm == 0 || sm == only_sm)
        for (auto dt : {FLASHJIT_FP16, FLASHJIT_BF16})
          for (int d : {64, 72, 80, 128, 256})
            for (int g : {1, 4, 6, 7, 8})
              for (int q : {1, 4})
                for (int page : {0, 1, 16, 64}) {
                  KernelSpec s = base(sm, dt, d, d, g, q, page);
                  s.causal = q > 1;
                  specs.push_back(s);
                }
    // flags and mixed dims
    for (int sm : {80, 90}) {
      if (only_sm != 0 && sm != only_sm)
        continue;
      KernelSpec s = base(sm, FLASHJIT_BF16, 128, 128, 4, 4, 16);
      s.causal = s.local = s.softcap = true;
      specs.push_back(s);
      s = base(sm, FLASHJIT_BF16, 192, 128, 8, 1, 16);
      specs.push_back(s);
      s = base(sm, FLASHJIT_FP16, 128, 128, 4, 1, 16);
      s.align_bytes = 2;
      specs.push_back(s);
      s = base(sm, FLASHJIT_BF16, 128, 128, 8, 16, 16);
      s.causal = true;
      specs.push_back(s);
    }
  } else {
    // Configs the GPU harness runs (sm_90a). Keep in sync with harness.cu's table.
    std::ifstream list(mode);
    std::string line;
    while (std::getline(list, line)) {
      if (line.empty() || line[0] == '#')
        continue;
      std::istringstream ls(line);
      std::string tag;
      int dt, dqk, dv, g, q, page, causal, local, softcap, align;
      ls >> tag >> dt >> dqk >> dv >> g >> q >> page >> causal >> local >> softcap >> align;
      int sm = 90;
      std::string extra;
      ls >> sm >> extra;
      extras.push_back(extra);
      KernelSpec s = base(sm, dt ? FLASHJIT_BF16 : FLASHJIT_FP16, dqk, dv, g, q, page);
      s.causal = causal;
      s.local = local;
      s.softcap = softcap;
      s.align_bytes = align;
      specs.push_back(s);
      tags.push_back(tag);
    }
  }
  int failures = 0;
  std::ofstream index(out / "index.txt");
  for (size_t si = 0; si < specs.size(); ++si) {
    const KernelSpec &s = specs[si];
    Plan plan;
    std::string why;
    // The spec's extras, "NAME=VALUE,..." (a bare NAME means 1), parsed once: planner tunings
    // (WARPS, WARPKEYS, TMAKV: DecodeTuning), build switches (TL, ONEPASS) and plan constants.
    std::vector<std::pair<std::string, int64_t>> items;
    if (si < extras.size()) {
      std::istringstream list(extras[si]);
      std::string item;
      while (std::getline(list, item, ',')) {
        const size_t eq = item.find('=');
        items.emplace_back(item.substr(0, eq), eq == std::string::npos ? 1 : std::stoll(item.substr(eq + 1)));
      }
    }
    DecodeTuning tuning;
    for (const auto &[key, value] : items) {
      if (key == "WARPS")
        tuning.warps = static_cast<int>(value);
      if (key == "WARPKEYS")
        tuning.warp_keys = static_cast<int>(value);
      if (key == "TMAKV")
        tuning.tma_kv = static_cast<int>(value);
    }
    // The "x" experiments below re-lay out the cp.async tiles' shared memory: they keep those tiles.
    if (si < tags.size() && tags[si][0] == 'x')
      tuning.tma_kv = 0;
    if (!plan_decode_tuned(s, tuning, &plan, &why)) {
      std::cout << "NOPLAN " << why << "\n";
      ++failures;
      continue;
    }
    // Experiment: tags "x<stages>c<ctas>_..." override the ring depth / CTAs per SM.
    if (si < tags.size() && tags[si][0] == 'x') {
      int stages = 0, ctas = 0;
      sscanf(tags[si].c_str(), "x%dc%d", &stages, &ctas);
      auto set = [&](const char *n, int64_t v) {
        for (auto &c : plan.constants)
          if (c.name == n)
            c.value = v;
      };
      const int64_t q = plan.constant("kSmemOffsetKV"), stage = plan.constant("kSmemStageBytes");
      const int64_t stats_bytes = plan.constant("kSmemOffsetPages") - plan.constant("kSmemOffsetStats");
      const int64_t warps = plan.threads / 32;
      const int64_t merge = warps * plan.block_m * plan.constant("kMergeRowFloats") * 4;
      const int64_t off_stats = q + std::max(stages * stage, merge);
      set("kStages", stages);
      set("kCtasPerSm", ctas);
      set("kSmemOffsetStats", off_stats);
      set("kSmemOffsetPages", off_stats + stats_bytes);
      plan.stages = stages;
      // Paged: the row-address ring, a K and a V address per tile row per stage (kernels/decode/smem.cuh).
      plan.smem_bytes = off_stats + stats_bytes + (s.page_size > 0 ? stages * 2 * plan.block_n * 8 : 0);
    }
    std::string prefix;
    for (const auto &[key, value] : items) {
      if (key == "WARPS" || key == "WARPKEYS")
        continue; // planned above
      if (key == "TL") {
        prefix += "#define FJ_DECODE_TIMELINE 1\n";
        continue;
      }
      if (key == "ONEPASS") {
        prefix += "#define FJ_DECODE_MERGE_ONE_PASS 1\n";
        continue;
      }
      if (key == "TMAKV")
        continue; // planned above
      bool found = false;
      for (auto &c : plan.constants)
        if (c.name == key) {
          c.value = value;
          found = true;
        }
      if (!found)
        plan.add(key, value);
    }
    // Every harness cubin carries its tag: variants of one spec must not share a file.
    std::string name = kernel_name(s, plan) + (si < tags.size() ? "." + tags[si] : "");
    Result r = compile(prefix + render_source(s, plan), s.arch, tpl);
    if (!r.ok) {
      std::cout << "FAIL " << name << "\n" << r.log << "\n";
      ++failures;
      continue;
    }
    std::string sum = summarize(r.log);
    if (si < tags.size())
      index << tags[si] << " " << name << "\n";
    std::cout << name << " thr" << plan.threads << " smem" << plan.smem_bytes << " ctas" << plan.constant("kCtasPerSm")
              << sum << "\n";
    std::ofstream(out / (name + ".cubin"), std::ios::binary).write(r.cubin.data(), r.cubin.size());
    std::ofstream meta(out / (name + ".meta"));
    meta << "threads " << plan.threads << "\nsmem " << plan.smem_bytes << "\n";
    for (auto &c : plan.constants)
      meta << c.name << " " << c.value << "\n";
  }
  std::cout << "specs " << specs.size() << " failures " << failures << "\n";
  return failures != 0;
}
