// Compile quality of the fa3 (sm_90a) kernel, checked without a GPU: every head dim compiles with
// no spills and no wgmma serialization, the PTX has the Hopper instructions, and the SASS has
// HGMMA and UTMALDG.
#include "compiler/plans/fa3_plan.hpp"
#include "tests/compile/compile_matrix.hpp"

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

namespace flashjit {
namespace {

struct Fa3Case {
  int dqk, dv;
  flashjit_dtype dtype;
  bool causal;
};

void PrintTo(const Fa3Case &c, std::ostream *out) {
  *out << "d" << c.dqk << "v" << c.dv;
}

std::vector<Fa3Case> fa3_cases() {
  std::vector<Fa3Case> cases;
  for (int d = 32; d <= 256; d += 8)
    for (flashjit_dtype dtype : {FLASHJIT_BF16, FLASHJIT_FP16})
      cases.push_back({d, d, dtype, (d / 8) % 2 == 1});
  for (auto [dqk, dv] : {std::pair{192, 128}, std::pair{128, 64}, std::pair{64, 256}})
    cases.push_back({dqk, dv, FLASHJIT_BF16, true});
  return cases;
}

class Fa3Compile : public ::testing::TestWithParam<Fa3Case> {};

using testing::count_of;

// ptxas serializes wgmmas it cannot pipeline by waiting (WARPGROUP.DEPBAR) after every HGMMA, and
// does not always say so: session 19's first cut of kFirstBlockInLoop made every pingpong kernel
// do that without a warning, and run 23a measured it 30-45% slower. Pipelined kernels wait at the
// few places the source does (4 in every default kernel of session 18).
bool wgmmas_serialized(const std::string &sass) {
  return 4 * count_of(sass, "WARPGROUP.DEPBAR") > count_of(sass, "HGMMA");
}

// Every wgmma.mma_async of a kernel's PTX, up to its ';'.
std::vector<std::string> wgmma_instructions(const std::string &ptx) {
  std::vector<std::string> out;
  for (size_t at = ptx.find("wgmma.mma_async"); at != std::string::npos; at = ptx.find("wgmma.mma_async", at + 1))
    out.push_back(ptx.substr(at, ptx.find(';', at) - at));
  return out;
}

// A QK wgmma: B = K, not transposed (the last immediate 0); P.V has B = V transposed (1).
bool is_qk_wgmma(const std::string &instruction) {
  return instruction.substr(instruction.size() - 2) == " 0";
}

TEST_P(Fa3Compile, HopperInstructionsNoSpillsNoSerialization) {
  const Fa3Case &c = GetParam();
  KernelSpec spec = testing::prefill_spec(Arch{90, true}, c.dqk, c.dv, c.dtype, c.causal);
  CompiledKernel kernel = testing::compile_or_fail(spec, Variant::fa3);
  ASSERT_FALSE(kernel.cubin.empty());
  EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name << "\n" << kernel.log;
  EXPECT_EQ(kernel.resources.spill_load_bytes, 0) << kernel.name;
  for (const std::string &warning : kernel.resources.warnings)
    ADD_FAILURE() << kernel.name << ": ptxas warning: " << warning;
  for (const char *instruction : {"wgmma.mma_async", "cp.async.bulk.tensor", "setmaxnreg"})
    EXPECT_NE(kernel.ptx.find(instruction), std::string::npos) << kernel.name << " lacks " << instruction;
  std::string error;
  const std::string sass = testing::dump_sass(kernel.cubin, &error);
  ASSERT_TRUE(error.empty()) << error;
  EXPECT_FALSE(wgmmas_serialized(sass)) << kernel.name << ": a wait after every HGMMA";
  // NVRTC's cold compile of one specialization is reported by `flashjit aot`; here, a loose guard.
  EXPECT_LT(kernel.compile_seconds, 10.0) << kernel.name;
}

INSTANTIATE_TEST_SUITE_P(EveryHeadDim, Fa3Compile, ::testing::ValuesIn(fa3_cases()),
                         [](const ::testing::TestParamInfo<Fa3Case> &info) {
                           const Fa3Case &c = info.param;
                           return "d" + std::to_string(c.dqk) + "v" + std::to_string(c.dv) + "_" +
                                  (c.dtype == FLASHJIT_FP16 ? "fp16" : "bf16") + (c.causal ? "_causal" : "");
                         });

// HGMMAs whose descriptor ptxas moved from ordinary registers between the warpgroup's
// WARPGROUP.ARRIVE and the HGMMA that closes its group (gsb0): an R2UR inside the group, or a
// uniform instruction computing from one, writes a uniform register the HGMMA's gdesc[URn]
// (URn..URn+3) reads. Session 10: in the tail split's key loop (a branch ptxas could not prove
// uniform) that came with a 2-7.5% loss; hoisted Q descriptors at d192/d256 alone measured within
// noise. An R2UR that ptxas merely schedules inside a group for other uniform work is not counted.
int r2ur_descriptors_inside_gemm_groups(const std::string &sass) {
  const std::regex instruction(R"(\*/\s+(@!?U?P\w+\s+)?([A-Za-z0-9_.]+)\s+([^;]*);)");
  const std::regex uniform_register(R"(\bUR(\d+)\b)");
  const std::regex descriptor(R"(gdesc\[UR(\d+)\])");
  constexpr int kDescriptorRegisters = 4; // gdesc[URn]: A's and B's 64-bit descriptors, URn..URn+3
  int moved = 0;
  bool inside = false;
  std::set<int> from_registers; // uniform registers written from ordinary ones inside the group
  std::istringstream lines(sass);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, instruction))
      continue;
    const std::string opcode = m[2].str(), operands = m[3].str();
    if (opcode == "WARPGROUP.ARRIVE") {
      inside = true;
      from_registers.clear();
      continue;
    }
    if (!inside)
      continue;
    if (opcode.rfind("HGMMA", 0) == 0) {
      std::smatch d;
      if (std::regex_search(operands, d, descriptor)) {
        const int base = std::stoi(d[1].str());
        for (int r = base; r < base + kDescriptorRegisters; ++r)
          if (from_registers.count(r) != 0) {
            ++moved;
            break;
          }
      }
      if (operands.find("gsb0") != std::string::npos)
        inside = false;
      continue;
    }
    // A uniform destination: tainted by an R2UR, or by a uniform source that is.
    std::smatch dest;
    const std::string first = operands.substr(0, operands.find(','));
    if (opcode[0] != 'U' && opcode.rfind("R2UR", 0) != 0)
      continue;
    if (!std::regex_search(first, dest, uniform_register))
      continue;
    bool tainted = opcode.rfind("R2UR", 0) == 0;
    const std::string sources = operands.substr(std::min(operands.size(), first.size() + 1));
    for (auto it = std::sregex_iterator(sources.begin(), sources.end(), uniform_register);
         !tainted && it != std::sregex_iterator(); ++it)
      tainted = from_registers.count(std::stoi((*it)[1].str())) != 0;
    const int written = std::stoi(dest[1].str());
    if (tainted)
      from_registers.insert(written);
    else
      from_registers.erase(written);
  }
  return moved;
}

TEST(Fa3Sass, HasHgmmaAndTmaLoads) {
  for (auto [d, causal] : {std::pair{64, false}, std::pair{80, false}, std::pair{128, false}, std::pair{192, false},
                           std::pair{256, false}, std::pair{256, true}}) {
    CompiledKernel kernel =
        testing::compile_or_fail(testing::prefill_spec(Arch{90, true}, d, d, FLASHJIT_BF16, causal), Variant::fa3);
    std::string error;
    const std::string sass = testing::dump_sass(kernel.cubin, &error);
    ASSERT_TRUE(error.empty()) << error;
    EXPECT_NE(sass.find("HGMMA"), std::string::npos) << kernel.name;
    EXPECT_NE(sass.find("UTMALDG"), std::string::npos) << kernel.name;
    EXPECT_EQ(sass.find("LDL"), std::string::npos) << kernel.name << " reads local memory";
    EXPECT_EQ(r2ur_descriptors_inside_gemm_groups(sass), 0) << kernel.name;
  }
}

// Unmasked head dims >= 128 run in CTA pairs that multicast K/V (compiler/plans/fa3_plan.cpp): the
// PTX has the multicast loads, the remote releases and the cluster barriers; masked, varlen and
// smaller head dims keep single-CTA tiles and none of those.
TEST(Fa3CompileFeatures, CtaPairsMulticastKv) {
  const char *pair_instructions[] = {"multicast::cluster", "mapa.shared::cluster", "mbarrier.arrive.shared::cluster",
                                     "barrier.cluster.arrive"};
  for (auto [dqk, dv] : {std::pair{128, 128}, std::pair{136, 136}, std::pair{192, 128}, std::pair{256, 256}}) {
    const KernelSpec spec = testing::prefill_spec(Arch{90, true}, dqk, dv, FLASHJIT_BF16, false);
    CompiledKernel kernel = testing::compile_or_fail(spec, Variant::fa3);
    EXPECT_NE(kernel.name.find(".cl2"), std::string::npos) << kernel.name;
    for (const char *instruction : pair_instructions)
      EXPECT_NE(kernel.ptx.find(instruction), std::string::npos) << kernel.name << " lacks " << instruction;
    EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name;
    std::string error;
    const std::string sass = testing::dump_sass(kernel.cubin, &error);
    ASSERT_TRUE(error.empty()) << error;
    EXPECT_NE(sass.find("UTMALDG"), std::string::npos) << kernel.name;
    EXPECT_NE(sass.find(".MULTICAST"), std::string::npos) << kernel.name << ": no multicast TMA load in SASS";
  }
  KernelSpec causal = testing::prefill_spec(Arch{90, true}, 128, 128, FLASHJIT_BF16, true);
  KernelSpec varlen = testing::prefill_spec(Arch{90, true}, 128, 128, FLASHJIT_BF16, false);
  varlen.varlen = true;
  KernelSpec small = testing::prefill_spec(Arch{90, true}, 96, 96, FLASHJIT_BF16, false);
  for (const KernelSpec &spec : {causal, varlen, small}) {
    CompiledKernel kernel = testing::compile_or_fail(spec, Variant::fa3);
    EXPECT_EQ(kernel.ptx.find("multicast::cluster"), std::string::npos) << kernel.name;
    EXPECT_EQ(kernel.ptx.find("barrier.cluster"), std::string::npos) << kernel.name;
  }
}

// Lazy O rescale (d72..d80 with 3 warpgroups, tiles without pingpong): the warp vote that skips the
// O FMULs is in the PTX; eager kernels have none.
TEST(Fa3CompileFeatures, LazyRescaleVotesBeforeTheOFmuls) {
  struct Case {
    int d;
    bool causal, lazy;
  };
  for (const Case &c :
       {Case{80, true, true}, Case{256, false, true}, Case{128, false, false}, Case{64, false, false}}) {
    const KernelSpec spec = testing::prefill_spec(Arch{90, true}, c.d, c.d, FLASHJIT_BF16, c.causal);
    CompiledKernel kernel = testing::compile_or_fail(spec, Variant::fa3);
    EXPECT_EQ(kernel.name.find(".lz") != std::string::npos, c.lazy) << kernel.name;
    EXPECT_EQ(kernel.ptx.find("vote.sync.any.pred") != std::string::npos, c.lazy) << kernel.name;
    EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name;
  }
}

// The NVRTC kernel of `spec` planned with `tuning`; the test fails when the planner or the build refuses.
CompiledKernel compile_tuned(const KernelSpec &spec, const Fa3Tuning &tuning) {
  Plan plan;
  std::string why;
  EXPECT_TRUE(plan_fa3_tuned(spec, tuning, &plan, &why)) << why;
  CompiledKernel kernel;
  Status s = build_kernel(spec, plan, FLASHJIT_BACKEND_NVRTC, &kernel);
  EXPECT_TRUE(s.ok()) << s.message;
  return kernel;
}

// The short causal tile's spec (issue 3's causal S1024 rows) at head dim d.
KernelSpec short_causal_spec(int d, flashjit_dtype dtype) {
  KernelSpec spec = testing::prefill_spec(Arch{90, true}, d, d, dtype, true);
  spec.key_block = fa3_short_key_block(spec, FLASHJIT_BACKEND_NVRTC);
  return spec;
}

// A tuned kernel beside the planner's kernel of the same spec (or the baseline tuning's): both compiled,
// their SASS, the tuned plan.
struct TunedAgainstDefault {
  CompiledKernel with, without;
  std::string sass, reference;
  Plan plan;
};
TunedAgainstDefault compile_against_default(const KernelSpec &spec, const Fa3Tuning &tuning,
                                            const Fa3Tuning &baseline = Fa3Tuning{}) {
  TunedAgainstDefault pair{compile_tuned(spec, tuning), compile_tuned(spec, baseline), {}, {}, {}};
  std::string error;
  pair.sass = testing::dump_sass(pair.with.cubin, &error);
  EXPECT_TRUE(error.empty()) << error;
  pair.reference = testing::dump_sass(pair.without.cubin, &error);
  EXPECT_TRUE(error.empty()) << error;
  std::string why;
  EXPECT_TRUE(plan_fa3_tuned(spec, tuning, &pair.plan, &why)) << why;
  return pair;
}

// r2ur_descriptors_inside_gemm_groups sees descriptors moved from ordinary registers: Q's hoisted descriptors at d256
// (q_desc_per_step=0), each built from its own address (desc_advance=0), outnumber the uniform registers, and ptxas
// moves them back per GEMM (compiler/plans/fa3_plan.cpp, kQDescPerStep); an R2UR written on a line of its own into a
// group, for other uniform work, is not counted.
TEST(Fa3Sass, TheDescriptorCheckSeesMovedDescriptors) {
  Fa3Tuning hoisted;
  hoisted.q_desc_per_step = 0;
  hoisted.desc_advance = 0;
  const CompiledKernel kernel =
      compile_tuned(testing::prefill_spec(Arch{90, true}, 256, 256, FLASHJIT_BF16, false), hoisted);
  std::string error;
  const std::string sass = testing::dump_sass(kernel.cubin, &error);
  ASSERT_TRUE(error.empty()) << error;
  EXPECT_GT(r2ur_descriptors_inside_gemm_groups(sass), 0) << kernel.name;
  const std::string group =
      "        /*0100*/                   WARPGROUP.ARRIVE ;\n"
      "        /*0110*/                   R2UR UR10, R20 ;\n"
      "        /*0120*/                   ULEA UR11, UR39, UR10, 0x6 ;\n"
      "        /*0130*/                   HGMMA.64x80x16.F32 R24, R96, gdesc[UR16].tnspB, R24, gsb0 ;\n";
  EXPECT_EQ(r2ur_descriptors_inside_gemm_groups(group), 0);
  const std::string moved =
      "        /*0100*/                   WARPGROUP.ARRIVE ;\n"
      "        /*0110*/                   R2UR UR10, R20 ;\n"
      "        /*0120*/                   UIADD3 UR18, UR10, 0x800, URZ ;\n"
      "        /*0130*/                   HGMMA.64x80x16.F32 R24, R96, gdesc[UR16].tnspB, R24, gsb0 ;\n";
  EXPECT_EQ(r2ur_descriptors_inside_gemm_groups(moved), 1);
}

// Advanced descriptors (kDescAdvance, the default but for the short causal tile) take one add per
// wgmma where built ones take an add, a shift, a mask and an or (session 36: ULOP3 and USHF were 26
// and 12 of the d64 causal key loop's 461 instructions per iteration). Counted over the whole SASS,
// with the same registers and no spills: two warpgroups with Q's descriptors per step (d128), Q in
// registers (the d64 short causal tile), three warpgroups (d96).
TEST(Fa3Sass, AdvancedDescriptorsTakeFewerUniformOps) {
  const Arch hopper{90, true};
  const KernelSpec short_causal = short_causal_spec(64, FLASHJIT_BF16);
  const std::vector<KernelSpec> specs = {testing::prefill_spec(hopper, 128, 128, FLASHJIT_BF16, false), short_causal,
                                         testing::prefill_spec(hopper, 96, 96, FLASHJIT_BF16, false)};
  Fa3Tuning built;
  built.desc_advance = 0;
  Fa3Tuning advanced_tuning;
  advanced_tuning.desc_advance = 1;
  for (const KernelSpec &spec : specs) {
    const CompiledKernel advanced_kernel = compile_tuned(spec, advanced_tuning);
    const CompiledKernel built_kernel = compile_tuned(spec, built);
    std::string error;
    const std::string advanced = testing::dump_sass(advanced_kernel.cubin, &error);
    ASSERT_TRUE(error.empty()) << error;
    const std::string reference = testing::dump_sass(built_kernel.cubin, &error);
    ASSERT_TRUE(error.empty()) << error;
    const auto uniform_ops = [](const std::string &sass) { return count_of(sass, "ULOP3") + count_of(sass, "USHF"); };
    EXPECT_NE(advanced_kernel.name.find(".da"), std::string::npos) << advanced_kernel.name;
    EXPECT_EQ(built_kernel.name.find(".da"), std::string::npos) << built_kernel.name;
    EXPECT_LT(3 * uniform_ops(advanced), 2 * uniform_ops(reference))
        << advanced_kernel.name << ": " << uniform_ops(advanced) << " ULOP3/USHF against " << uniform_ops(reference);
    EXPECT_EQ(count_of(advanced, "HGMMA"), count_of(reference, "HGMMA")) << advanced_kernel.name;
    EXPECT_FALSE(wgmmas_serialized(advanced)) << advanced_kernel.name << ": a wait after every HGMMA";
    EXPECT_EQ(r2ur_descriptors_inside_gemm_groups(advanced), 0) << advanced_kernel.name;
    EXPECT_EQ(advanced_kernel.resources.registers, built_kernel.resources.registers) << advanced_kernel.name;
    EXPECT_EQ(advanced_kernel.resources.spill_store_bytes, 0) << advanced_kernel.name;
  }
}

// The instructions between each pingpong turn's barrier in the SASS (BAR.SYNC on a register id, for the
// two warpgroups of a turn: 0x100 threads) and the first HGMMA after it.
std::vector<int> turn_to_first_wgmma(const std::string &sass) {
  const std::regex instruction(R"(/\*[0-9a-f]+\*/\s+[^;]+;)");
  const std::regex turn_barrier(R"(BAR\.SYNC\.DEFER_BLOCKING R\d+, 0x100\s*;)");
  std::vector<int> gaps;
  int since_turn = -1; // instructions since the last turn barrier, -1 outside a turn
  std::istringstream lines(sass);
  for (std::string line; std::getline(lines, line);) {
    if (!std::regex_search(line, instruction))
      continue;
    if (std::regex_search(line, turn_barrier)) {
      since_turn = 0;
    } else if (since_turn >= 0 && line.find("HGMMA") != std::string::npos) {
      gaps.push_back(since_turn);
      since_turn = -1;
    } else if (since_turn >= 0) {
      ++since_turn;
    }
  }
  return gaps;
}

// A QK's first descriptors built before the K wait (kEarlyQkDesc, `.eqd`, a tuning): written after the
// turn's barrier, ptxas schedules their uniform-datapath instructions between the hand-off and the
// warpgroup's first HGMMA (12-15 in session 44's d128 S4096 and d256 causal kernels); built early, the
// key loop's turns reach their first HGMMA in fewer. The same instructions otherwise: count, HGMMAs,
// registers, no spills, no serialization.
TEST(Fa3Sass, EarlyQkDescriptorsShortenTheTurn) {
  const Arch hopper{90, true};
  for (const KernelSpec &spec : {testing::prefill_spec(hopper, 128, 128, FLASHJIT_BF16, false),
                                 testing::prefill_spec(hopper, 256, 256, FLASHJIT_BF16, true)}) {
    Fa3Tuning late;
    late.early_qk_desc = 0;
    Fa3Tuning early_tuning;
    early_tuning.early_qk_desc = 1;
    const CompiledKernel early_kernel = compile_tuned(spec, early_tuning);
    const CompiledKernel late_kernel = compile_tuned(spec, late);
    EXPECT_NE(early_kernel.name.find(".eqd"), std::string::npos) << early_kernel.name;
    EXPECT_EQ(late_kernel.name.find(".eqd"), std::string::npos) << late_kernel.name;
    std::string error;
    const std::string early = testing::dump_sass(early_kernel.cubin, &error);
    ASSERT_TRUE(error.empty()) << error;
    const std::string reference = testing::dump_sass(late_kernel.cubin, &error);
    ASSERT_TRUE(error.empty()) << error;
    const std::vector<int> early_gaps = turn_to_first_wgmma(early), late_gaps = turn_to_first_wgmma(reference);
    ASSERT_FALSE(early_gaps.empty()) << early_kernel.name << ": no pingpong turn found";
    ASSERT_EQ(early_gaps.size(), late_gaps.size()) << early_kernel.name;
    constexpr int kFewerInTheLoopTurn = 4; // session 44: 13 -> 7 (d128), 11 -> 6 (d256 causal)
    EXPECT_LE(*std::min_element(early_gaps.begin(), early_gaps.end()) + kFewerInTheLoopTurn,
              *std::min_element(late_gaps.begin(), late_gaps.end()))
        << early_kernel.name << ": " << ::testing::PrintToString(early_gaps) << " against "
        << ::testing::PrintToString(late_gaps);
    EXPECT_EQ(count_of(early, "HGMMA"), count_of(reference, "HGMMA")) << early_kernel.name;
    EXPECT_FALSE(wgmmas_serialized(early)) << early_kernel.name << ": a wait after every HGMMA";
    EXPECT_EQ(r2ur_descriptors_inside_gemm_groups(early), 0) << early_kernel.name;
    EXPECT_EQ(early_kernel.resources.registers, late_kernel.resources.registers) << early_kernel.name;
    EXPECT_EQ(early_kernel.resources.spill_store_bytes, 0) << early_kernel.name;
    for (const std::string &warning : early_kernel.resources.warnings)
      ADD_FAILURE() << early_kernel.name << ": ptxas warning: " << warning;
  }
}

// The timeline build (kTimeline, `.tl`, a diagnostic): its module global and cycle reads are in the PTX, no
// call (a call would serialize every wgmma, C7510), the consumers' registers and HGMMAs as without it; the
// default kernel has neither. The producer (24 registers) may spill a few bytes for its points.
TEST(Fa3Sass, TimelineRecordsWithoutTouchingTheGemms) {
  const Arch hopper{90, true};
  for (const KernelSpec &spec : {testing::prefill_spec(hopper, 128, 128, FLASHJIT_BF16, false),
                                 testing::prefill_spec(hopper, 64, 64, FLASHJIT_BF16, true)}) {
    Fa3Tuning timeline;
    timeline.timeline = 1;
    const CompiledKernel recorded = compile_tuned(spec, timeline);
    const CompiledKernel plain = compile_tuned(spec, Fa3Tuning{});
    EXPECT_NE(recorded.name.find(".tl"), std::string::npos) << recorded.name;
    EXPECT_NE(recorded.ptx.find("fj_fa3_timeline"), std::string::npos) << recorded.name;
    EXPECT_NE(recorded.ptx.find("%clock64"), std::string::npos) << recorded.name;
    EXPECT_EQ(recorded.ptx.find("call"), std::string::npos) << recorded.name;
    EXPECT_EQ(plain.ptx.find("fj_fa3_timeline"), std::string::npos) << plain.name;
    EXPECT_EQ(plain.ptx.find("%clock64"), std::string::npos) << plain.name;
    std::string error;
    const std::string sass = testing::dump_sass(recorded.cubin, &error);
    ASSERT_TRUE(error.empty()) << error;
    const std::string reference = testing::dump_sass(plain.cubin, &error);
    ASSERT_TRUE(error.empty()) << error;
    EXPECT_EQ(count_of(sass, "HGMMA"), count_of(reference, "HGMMA")) << recorded.name;
    EXPECT_FALSE(wgmmas_serialized(sass)) << recorded.name << ": a wait after every HGMMA";
    EXPECT_EQ(recorded.resources.registers, plain.resources.registers) << recorded.name;
    for (const std::string &warning : recorded.resources.warnings)
      ADD_FAILURE() << recorded.name << ": ptxas warning: " << warning;
  }
}

// S awaited before the PV is issued (kSBeforePv, `.sbp`, a tuning): the step's wait for all but the PV's
// wgmma group (WARPGROUP.DEPBAR.LE gsb0, 0x1) becomes a wait for the QK's group before the PV's issue, so no
// wait for one group in flight is left; the same HGMMAs, no serialized wgmmas, no spills, no ptxas warning.
// On d128 S4096's kernel (the tail split), the d64 short causal tile and d256.
TEST(Fa3Sass, SBeforePvWaitsForTheQkBeforeThePvIssue) {
  const Arch hopper{90, true};
  for (const KernelSpec &spec :
       {testing::prefill_spec(hopper, 128, 128, FLASHJIT_BF16, false), short_causal_spec(64, FLASHJIT_BF16),
        testing::prefill_spec(hopper, 256, 256, FLASHJIT_FP16, false)}) {
    Fa3Tuning s_first;
    s_first.s_before_pv = 1;
    const TunedAgainstDefault k = compile_against_default(spec, s_first);
    EXPECT_NE(k.with.name.find(".sbp"), std::string::npos) << k.with.name;
    EXPECT_EQ(k.without.name.find(".sbp"), std::string::npos) << k.without.name;
    EXPECT_GT(count_of(k.reference, "gsb0, 0x1"), 0) << k.without.name;
    EXPECT_EQ(count_of(k.sass, "gsb0, 0x1"), 0) << k.with.name;
    EXPECT_EQ(count_of(k.sass, "WARPGROUP.DEPBAR"), count_of(k.reference, "WARPGROUP.DEPBAR")) << k.with.name;
    EXPECT_EQ(count_of(k.sass, "HGMMA"), count_of(k.reference, "HGMMA")) << k.with.name;
    EXPECT_FALSE(wgmmas_serialized(k.sass)) << k.with.name << ": a wait after every HGMMA";
    EXPECT_EQ(k.with.resources.spill_store_bytes, 0) << k.with.name;
    for (const std::string &warning : k.with.resources.warnings)
      ADD_FAILURE() << k.with.name << ": ptxas warning: " << warning;
  }
}

// Exponentials before the block's max (kExpBeforeMax, `.ebm`, a tuning), read after the key loop's first
// PV wgmma (N = head_dim_v): at most two FMNMX before the first MUFU.EX2, where the default kernel
// computes both rows' maxima first (at least a quarter of the block's columns in FMNMX), and the
// warpgroup's vote (BAR.RED) after all of the block's exponentials (block_n / 2 per thread), not before
// them; one more QK's HGMMAs (the recompute of S) and one more BAR.RED, no serialized wgmmas, no spills,
// no ptxas warning. On d128 S4096's kernel (the tail split), the d64 short causal tile (Q in registers)
// and d256 (no pingpong; both sides with lazy_rescale=0).
int count_between(const std::string &sass, const std::string &what, size_t from, size_t to) {
  int n = 0;
  for (size_t at = sass.find(what, from); at < to; at = sass.find(what, at + what.size()))
    ++n;
  return n;
}
TEST(Fa3Sass, ExpBeforeMaxStartsTheExponentialsBeforeTheMax) {
  const Arch hopper{90, true};
  for (const KernelSpec &spec :
       {testing::prefill_spec(hopper, 128, 128, FLASHJIT_BF16, false), short_causal_spec(64, FLASHJIT_FP16),
        testing::prefill_spec(hopper, 256, 256, FLASHJIT_BF16, false)}) {
    Fa3Tuning before_max;
    before_max.exp_before_max = 1;
    before_max.lazy_rescale = 0;
    Fa3Tuning eager;
    eager.lazy_rescale = 0;
    const TunedAgainstDefault k = compile_against_default(spec, before_max, eager);
    EXPECT_NE(k.with.name.find(".ebm"), std::string::npos) << k.with.name;
    EXPECT_EQ(k.without.name.find(".ebm"), std::string::npos) << k.without.name;
    const int block_n = k.plan.block_n;
    const std::string pv = "HGMMA.64x" + std::to_string(spec.head_dim_v) + "x16";
    for (const auto &[sass, name, before] :
         {std::tuple{&k.sass, &k.with.name, true}, std::tuple{&k.reference, &k.without.name, false}}) {
      const size_t loop_pv = sass->find(pv);
      ASSERT_NE(loop_pv, std::string::npos) << *name;
      const size_t mufu = sass->find("MUFU.EX2", loop_pv);
      ASSERT_NE(mufu, std::string::npos) << *name;
      const int max_ops = count_between(*sass, "FMNMX", loop_pv, mufu);
      if (before) {
        EXPECT_LE(max_ops, 2) << *name;
        const size_t vote = sass->find("BAR.RED", loop_pv);
        ASSERT_NE(vote, std::string::npos) << *name;
        EXPECT_GE(count_between(*sass, "MUFU.EX2", loop_pv, vote), block_n / 2) << *name;
      } else {
        EXPECT_GE(max_ops, block_n / 4) << *name;
      }
    }
    const int qk_steps = (spec.head_dim_qk + 15) / 16;
    EXPECT_EQ(count_of(k.sass, "HGMMA"), count_of(k.reference, "HGMMA") + qk_steps) << k.with.name;
    EXPECT_EQ(count_of(k.sass, "BAR.RED"), count_of(k.reference, "BAR.RED") + 1) << k.with.name;
    EXPECT_FALSE(wgmmas_serialized(k.sass)) << k.with.name << ": a wait after every HGMMA";
    EXPECT_EQ(k.with.resources.spill_store_bytes, 0) << k.with.name;
    for (const std::string &warning : k.with.resources.warnings)
      ADD_FAILURE() << k.with.name << ": ptxas warning: " << warning;
  }
}

// What each pingpong turn holds, read from the PTX: the instructions between a warpgroup's wait for
// its turn (bar.sync on the barrier count of two warpgroups, a register the PTX sets by mov) and its
// hand-over (bar.arrive on it), in PTX order.
struct TurnContents {
  int turns = 0, wgmmas = 0, exponentials = 0;
};
TurnContents turn_contents(const std::string &ptx, int turn_threads) {
  const std::regex set_count("mov\\.u32\\s+(%r\\d+), " + std::to_string(turn_threads) + ";");
  const std::regex barrier("bar\\.(sync|arrive)\\s+%r\\d+, (%r\\d+);");
  std::set<std::string> count_registers;
  for (std::sregex_iterator it(ptx.begin(), ptx.end(), set_count), end; it != end; ++it)
    count_registers.insert((*it)[1]);
  TurnContents contents;
  bool inside = false;
  std::istringstream lines(ptx);
  for (std::string line; std::getline(lines, line);) {
    std::smatch match;
    if (std::regex_search(line, match, barrier) && count_registers.count(match[2])) {
      inside = match[1] == "sync";
      contents.turns += inside;
    } else if (inside) {
      contents.wgmmas += line.find("wgmma.mma_async") != std::string::npos;
      contents.exponentials += line.find("ex2.approx") != std::string::npos;
    }
  }
  return contents;
}

// How many ex2.approx arguments each PTX opcode computes (the operand's defining instruction).
std::map<std::string, int> exponent_producers(const std::string &ptx) {
  const std::regex definition("^\\s*([a-z][a-z0-9.]*)\\s+(%f\\d+),");
  const std::regex exponential("ex2\\.approx\\.ftz\\.f32 %f\\d+, (%f\\d+);");
  std::map<std::string, std::string> defined_by;
  std::map<std::string, int> producers;
  std::istringstream lines(ptx);
  for (std::string line; std::getline(lines, line);) {
    std::smatch match;
    if (std::regex_search(line, match, exponential))
      ++producers[defined_by[match[1]]];
    else if (std::regex_search(line, match, definition))
      defined_by[match[2]] = match[1];
  }
  return producers;
}

// The pingpong's turn over the softmax (a tuning, kPingpongSoftmax, `.pps`): the exponentials sit
// inside the turns and the wgmmas outside, where FA-3's order (the default) has them the other way
// round. The exponent as (s - max) * c (kExpSubtractFirst, `.es`): a multiply computes each ex2's
// argument, where the default's s * c - max * c ends in a subtract (which ptxas fuses into an FFMA).
// A turn over the QK only (kTurnOverQk, `.tq`): as many turns, each with fewer wgmmas (the PV's are
// issued after the hand-off). No spills and no serialized wgmmas; on the d64 short causal tile (Q in
// registers) and d128.
TEST(Fa3CompileFeatures, PingpongTurnsCoverTheChosenPhase) {
  const Arch hopper{90, true};
  const KernelSpec short_causal = short_causal_spec(64, FLASHJIT_BF16);
  constexpr int kTurnThreads = 2 * 128; // a turn's barrier: the waiting and the handing warpgroup
  for (const KernelSpec &spec : {short_causal, testing::prefill_spec(hopper, 128, 128, FLASHJIT_BF16, false)}) {
    Fa3Tuning gemm_turns;
    gemm_turns.pingpong = 1;
    gemm_turns.tail_split = 0; // its merge barrier counts the same 256 threads
    Fa3Tuning softmax_turns = gemm_turns;
    softmax_turns.pingpong_softmax = 1;
    Fa3Tuning subtract_first = gemm_turns;
    subtract_first.exp_subtract_first = 1;
    const CompiledKernel gemm = compile_tuned(spec, gemm_turns);
    const CompiledKernel softmax = compile_tuned(spec, softmax_turns);
    const CompiledKernel subtract = compile_tuned(spec, subtract_first);
    Fa3Tuning qk_turns = gemm_turns;
    qk_turns.turn_over_qk = 1;
    const CompiledKernel qk = compile_tuned(spec, qk_turns);
    EXPECT_NE(qk.name.find(".tq"), std::string::npos) << qk.name;
    EXPECT_EQ(gemm.name.find(".tq"), std::string::npos) << gemm.name;
    EXPECT_EQ(gemm.name.find(".pps"), std::string::npos) << gemm.name;
    EXPECT_NE(softmax.name.find(".pps"), std::string::npos) << softmax.name;
    EXPECT_NE(subtract.name.find(".es"), std::string::npos) << subtract.name;
    const TurnContents by_gemm = turn_contents(gemm.ptx, kTurnThreads);
    const TurnContents by_softmax = turn_contents(softmax.ptx, kTurnThreads);
    EXPECT_GT(by_gemm.turns, 0) << gemm.name;
    EXPECT_GT(by_gemm.wgmmas, 0) << gemm.name;
    EXPECT_EQ(by_gemm.exponentials, 0) << gemm.name;
    EXPECT_GT(by_softmax.turns, 0) << softmax.name;
    EXPECT_EQ(by_softmax.wgmmas, 0) << softmax.name;
    EXPECT_GE(by_softmax.exponentials, spec.key_block / 2) << softmax.name; // a thread's share of one block
    const TurnContents by_qk = turn_contents(qk.ptx, kTurnThreads);
    EXPECT_EQ(by_qk.turns, by_gemm.turns) << qk.name;
    EXPECT_GT(by_qk.wgmmas, 0) << qk.name;
    EXPECT_LT(by_qk.wgmmas, by_gemm.wgmmas) << qk.name;
    EXPECT_EQ(count_of(qk.ptx, "wgmma.mma_async"), count_of(gemm.ptx, "wgmma.mma_async")) << qk.name;
    const int exponentials = count_of(gemm.ptx, "ex2.approx");
    EXPECT_EQ(count_of(subtract.ptx, "ex2.approx"), exponentials) << subtract.name;
    EXPECT_GE(exponent_producers(gemm.ptx)["sub.f32"], exponentials - 2 * 2) << gemm.name; // but the rows' factors
    EXPECT_GE(exponent_producers(subtract.ptx)["mul.f32"], exponentials - 2 * 2) << subtract.name;
    for (const CompiledKernel *kernel : {&gemm, &softmax, &subtract, &qk}) {
      std::string error;
      const std::string sass = testing::dump_sass(kernel->cubin, &error);
      ASSERT_TRUE(error.empty()) << error;
      EXPECT_FALSE(wgmmas_serialized(sass)) << kernel->name << ": a wait after every HGMMA";
      EXPECT_EQ(kernel->resources.spill_store_bytes, 0) << kernel->name;
    }
  }
}

// The prologue block's exponentials skipped for column chunks the mask hides from a whole warp (a
// tuning, kSkipMaskedGroups, `.skm`): one warp-uniform branch per 16-column chunk and row in that
// block's softmax, the same exponentials in the code (the key loop keeps all of its own), the same
// registers and no spills; at d64 (the short causal tile, Q in registers), d128 causal with three
// warpgroups, d256 causal.
TEST(Fa3CompileFeatures, SkipMaskedGroupsBranchesAroundExponentials) {
  const Arch hopper{90, true};
  for (const KernelSpec &spec :
       {short_causal_spec(64, FLASHJIT_BF16), testing::prefill_spec(hopper, 128, 128, FLASHJIT_FP16, true),
        testing::prefill_spec(hopper, 256, 256, FLASHJIT_BF16, true)}) {
    Fa3Tuning skip;
    skip.skip_masked_groups = 1;
    const TunedAgainstDefault k = compile_against_default(spec, skip);
    EXPECT_NE(k.with.name.find(".skm"), std::string::npos) << k.with.name;
    EXPECT_EQ(k.without.name.find(".skm"), std::string::npos) << k.without.name;
    constexpr int kColsPerChunk = 16, kColsPerGroup = 8, kRowsPerThread = 2; // odd group counts skip by group
    const int branches =
        kRowsPerThread * k.plan.block_n / (k.plan.block_n % kColsPerChunk == 0 ? kColsPerChunk : kColsPerGroup);
    EXPECT_GE(count_of(k.sass, "BRA"), count_of(k.reference, "BRA") + branches) << k.with.name;
    EXPECT_EQ(count_of(k.sass, "MUFU.EX2"), count_of(k.reference, "MUFU.EX2")) << k.with.name;
    EXPECT_EQ(count_of(k.sass, "HGMMA"), count_of(k.reference, "HGMMA")) << k.with.name;
    EXPECT_FALSE(wgmmas_serialized(k.sass)) << k.with.name << ": a wait after every HGMMA";
    EXPECT_EQ(k.with.resources.registers, k.without.resources.registers) << k.with.name;
    EXPECT_EQ(k.with.resources.spill_store_bytes, 0) << k.with.name;
  }
}

// The half form of the same tuning (skip_masked_groups=2, `.skh`): the prologue block's softmax
// compiled twice, over all of the block's columns and over its first half, so the code gains half a
// block's exponentials per row and one branch between the forms; no serialization, no spills, and
// no more registers.
TEST(Fa3CompileFeatures, SkipMaskedGroupsHalvesThePrologueSoftmax) {
  for (const KernelSpec &spec : {short_causal_spec(64, FLASHJIT_BF16), short_causal_spec(128, FLASHJIT_FP16)}) {
    Fa3Tuning halves;
    halves.skip_masked_groups = 2;
    const TunedAgainstDefault k = compile_against_default(spec, halves);
    EXPECT_NE(k.with.name.find(".skh"), std::string::npos) << k.with.name;
    constexpr int kRowsPerThread = 2, kColsPerThreadPerGroup = 2, kColsPerGroup = 8;
    const size_t half_block = kRowsPerThread * kColsPerThreadPerGroup * k.plan.block_n / kColsPerGroup / 2;
    EXPECT_GE(count_of(k.sass, "MUFU.EX2"), count_of(k.reference, "MUFU.EX2") + half_block) << k.with.name;
    EXPECT_GT(count_of(k.sass, "BRA"), count_of(k.reference, "BRA")) << k.with.name;
    EXPECT_EQ(count_of(k.sass, "HGMMA"), count_of(k.reference, "HGMMA")) << k.with.name;
    EXPECT_FALSE(wgmmas_serialized(k.sass)) << k.with.name << ": a wait after every HGMMA";
    EXPECT_LE(k.with.resources.registers, k.without.resources.registers) << k.with.name;
    EXPECT_EQ(k.with.resources.spill_store_bytes, 0) << k.with.name;
  }
}

// Lazy rescaling's top rounding (a tuning, kLazyTopRounding): one scalar 16-bit rounding per row and
// key block (the P pairs round as bf16x2), and no exp2 of its own (the block's top p takes the exp2
// of the factor, which a kept max does not need), no spills; with the tail split, the varlen form
// (lazy_rescale=1 too) and causal three warpgroups.
TEST(Fa3CompileFeatures, LazyTopRoundingAddsNoExp2) {
  Fa3Tuning rounded;
  rounded.lazy_rescale = 1;
  rounded.lazy_top_rounding = 1;
  Fa3Tuning lazy;
  lazy.lazy_rescale = 1;
  lazy.lazy_top_rounding = 0; // varlen specs round by default
  KernelSpec varlen = testing::prefill_spec(Arch{90, true}, 192, 192, FLASHJIT_BF16, false);
  varlen.varlen = true;
  for (const KernelSpec &spec : {testing::prefill_spec(Arch{90, true}, 80, 80, FLASHJIT_BF16, false),
                                 testing::prefill_spec(Arch{90, true}, 128, 128, FLASHJIT_FP16, true), varlen}) {
    const CompiledKernel with = compile_tuned(spec, rounded);
    const CompiledKernel without = compile_tuned(spec, lazy);
    ASSERT_FALSE(with.cubin.empty());
    EXPECT_NE(with.name.find(".lzt"), std::string::npos) << with.name;
    const std::string round = spec.dtype == FLASHJIT_BF16 ? "cvt.rn.bf16.f32" : "cvt.rn.f16.f32";
    EXPECT_GT(count_of(with.ptx, round), count_of(without.ptx, round)) << with.name;
    EXPECT_EQ(count_of(with.ptx, "ex2.approx"), count_of(without.ptx, "ex2.approx")) << with.name;
    EXPECT_EQ(with.resources.spill_store_bytes, 0) << with.name;
  }
}

// The tail split (a tuning, kTailSplit): a cut tile's pieces arrive on a grid-scope counter and
// the second folds the first's state in, read through L2; one named barrier of the consumer
// warpgroups broadcasts which CTA that is. Spills as session 10 measured them (none on the default
// kernels; the split is off by default, see docs/perf-notes.md).
TEST(Fa3CompileFeatures, TailSplitArrivesAndMergesThroughL2) {
  Fa3Tuning tuning;
  tuning.tail_split = 1;
  for (int d : {64, 128, 192, 256}) {
    const CompiledKernel kernel =
        compile_tuned(testing::prefill_spec(Arch{90, true}, d, d, FLASHJIT_BF16, false), tuning);
    ASSERT_FALSE(kernel.cubin.empty());
    EXPECT_NE(kernel.name.find(".ts"), std::string::npos) << kernel.name;
    for (const char *instruction :
         {"atom.acq_rel.gpu.global.add.s32", "fence.acq_rel.gpu", "bar.red.or.pred", "redux.sync.or.b32",
          "st.relaxed.gpu.global.s32", "st.global.v4.f32", "ld.global.cg.v4.f32", "wgmma.mma_async"})
      EXPECT_NE(kernel.ptx.find(instruction), std::string::npos) << kernel.name << " lacks " << instruction;
    EXPECT_LE(kernel.resources.spill_store_bytes, 4) << kernel.name << ": more spills than session 10 measured";
    // Session 10: a branch on the barrier's answer that ptxas could not prove uniform moved the key
    // loop's descriptors out of uniform registers (an R2UR before every GEMM; -2..-7.5% on the GPU).
    std::string error;
    const std::string sass = testing::dump_sass(kernel.cubin, &error);
    ASSERT_TRUE(error.empty()) << error;
    EXPECT_EQ(r2ur_descriptors_inside_gemm_groups(sass), 0) << kernel.name;
  }
}

// Dynamic tiles (a tuning, kDynamicTiles): the producer draws tiles from a relaxed grid-scope
// counter (and the last draw stores it back to zero) and hands them over through shared memory;
// the consumers' key loop is the snake kernel's (no spills, no serialized wgmma, no descriptor moved
// out of uniform registers), at the causal rows it was built for and an unmasked single-CTA walk.
TEST(Fa3CompileFeatures, DynamicTilesDrawFromACounter) {
  Fa3Tuning drawn;
  drawn.dynamic_tiles = 1;
  Fa3Tuning unmasked = drawn;
  unmasked.cluster_m = 1;
  unmasked.tail_split = 0;
  const std::pair<int, bool> cases[] = {{192, true}, {64, true}, {80, true}, {128, false}};
  for (const auto &[d, causal] : cases) {
    const CompiledKernel kernel =
        compile_tuned(testing::prefill_spec(Arch{90, true}, d, d, FLASHJIT_BF16, causal), causal ? drawn : unmasked);
    ASSERT_FALSE(kernel.cubin.empty());
    EXPECT_NE(kernel.name.find(".dt"), std::string::npos) << kernel.name;
    for (const char *instruction : {"atom.relaxed.gpu.global.add.s32", "st.relaxed.gpu.global.s32", "st.shared.b32",
                                    "ld.shared.b32", "wgmma.mma_async", "cp.async.bulk.tensor", "setmaxnreg"})
      EXPECT_NE(kernel.ptx.find(instruction), std::string::npos) << kernel.name << " lacks " << instruction;
    EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name;
    std::string error;
    const std::string sass = testing::dump_sass(kernel.cubin, &error);
    ASSERT_TRUE(error.empty()) << error;
    EXPECT_FALSE(wgmmas_serialized(sass)) << kernel.name << ": a wait after every HGMMA";
    EXPECT_EQ(r2ur_descriptors_inside_gemm_groups(sass), 0) << kernel.name;
  }
}

// Q in registers (a tuning, kQInRegisters): the QK wgmmas take Q's A fragments from registers
// (RS), loaded once per tile with ldmatrix; only K comes from shared memory. At d128 with the 128-key
// block it compiles clean (session 12); N160 spills and serializes, which is why it stays a tuning.
TEST(Fa3CompileFeatures, QInRegistersTakesQkAFromRegisters) {
  Fa3Tuning tuning;
  tuning.q_in_registers = 1;
  tuning.block_n = 128;
  const CompiledKernel kernel =
      compile_tuned(testing::prefill_spec(Arch{90, true}, 128, 128, FLASHJIT_BF16, false), tuning);
  ASSERT_FALSE(kernel.cubin.empty());
  EXPECT_NE(kernel.name.find(".qr"), std::string::npos) << kernel.name;
  EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name << "\n" << kernel.log;
  for (const std::string &warning : kernel.resources.warnings)
    ADD_FAILURE() << kernel.name << ": ptxas warning: " << warning;
  // Every QK wgmma has its A operand in braces, i.e. in registers: 8 k-steps at d128, in the first
  // block's issue and in the key loop's.
  size_t rs_qk = 0, ss_qk = 0;
  for (const std::string &instruction : wgmma_instructions(kernel.ptx))
    if (is_qk_wgmma(instruction))
      (std::count(instruction.begin(), instruction.end(), '{') == 2 ? rs_qk : ss_qk) += 1;
  EXPECT_EQ(rs_qk, 2u * 8u) << kernel.name;
  EXPECT_EQ(ss_qk, 0u) << kernel.name;
  EXPECT_NE(kernel.ptx.find("ldmatrix.sync.aligned.m8n8.x4.shared.b16"), std::string::npos) << kernel.name;
}

// The short causal tile (the key block spec_for_problem picks for causal sequences up to
// kMaxSeqlenShortCausal) as the planner builds it: no spills, no ptxas warning, no serialized wgmma
// and no descriptor moved out of uniform registers; up to d64 its QK takes Q's A fragments from
// registers (kQInRegistersShortCausalSmallDim), above that from shared memory.
TEST(Fa3CompileFeatures, ShortCausalTilesCompileClean) {
  struct Case {
    int d;
    flashjit_dtype dtype;
  };
  for (const Case &c : {Case{32, FLASHJIT_BF16}, Case{64, FLASHJIT_BF16}, Case{64, FLASHJIT_FP16},
                        Case{128, FLASHJIT_BF16}, Case{192, FLASHJIT_BF16}}) {
    KernelSpec spec = testing::prefill_spec(Arch{90, true}, c.d, c.d, c.dtype, true);
    spec.key_block = fa3_short_key_block(spec, FLASHJIT_BACKEND_NVRTC);
    ASSERT_GT(spec.key_block, 0) << "d" << c.d;
    const CompiledKernel kernel = testing::compile_or_fail(spec, Variant::fa3);
    ASSERT_FALSE(kernel.cubin.empty());
    EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name << "\n" << kernel.log;
    for (const std::string &warning : kernel.resources.warnings)
      ADD_FAILURE() << kernel.name << ": ptxas warning: " << warning;
    std::string error;
    const std::string sass = testing::dump_sass(kernel.cubin, &error);
    ASSERT_TRUE(error.empty()) << error;
    EXPECT_FALSE(wgmmas_serialized(sass)) << kernel.name << ": a wait after every HGMMA";
    EXPECT_EQ(r2ur_descriptors_inside_gemm_groups(sass), 0) << kernel.name;
    const bool register_q = c.d <= 64;
    EXPECT_EQ(kernel.name.find(".qr") != std::string::npos, register_q) << kernel.name;
    size_t rs_qk = 0, ss_qk = 0;
    for (const std::string &instruction : wgmma_instructions(kernel.ptx))
      if (is_qk_wgmma(instruction))
        (std::count(instruction.begin(), instruction.end(), '{') == 2 ? rs_qk : ss_qk) += 1;
    EXPECT_GT(register_q ? rs_qk : ss_qk, 0u) << kernel.name;
    EXPECT_EQ(register_q ? ss_qk : rs_qk, 0u) << kernel.name;
  }
}

// QK and PV wgmmas in a kernel's PTX.
std::pair<size_t, size_t> qk_pv_wgmmas(const std::string &ptx) {
  size_t qk = 0, pv = 0;
  for (const std::string &instruction : wgmma_instructions(ptx))
    (is_qk_wgmma(instruction) ? qk : pv) += 1;
  return {qk, pv};
}

// The first block in the key loop (kFirstBlockInLoop; at d128 a tuning, the pingpong kernels' default
// being the prologue form): one copy of the softmax's exponentials, where the prologue form has two.
// Both compile clean and keep their wgmmas pipelined. Cold compile times are printed by `flashjit
// aot`, not tested here.
TEST(Fa3CompileFeatures, FirstBlockInLoopCompilesTheSoftmaxOnce) {
  for (bool causal : {false, true}) {
    const KernelSpec spec = testing::prefill_spec(Arch{90, true}, 128, 128, FLASHJIT_BF16, causal);
    Fa3Tuning in_loop_tuning;
    in_loop_tuning.first_block_in_loop = 1;
    const CompiledKernel in_loop = compile_tuned(spec, in_loop_tuning);
    const CompiledKernel prologue = compile_tuned(spec, Fa3Tuning{});
    ASSERT_FALSE(in_loop.cubin.empty());
    ASSERT_FALSE(prologue.cubin.empty());
    EXPECT_NE(in_loop.name.find(".fl"), std::string::npos) << in_loop.name;
    EXPECT_EQ(prologue.name.find(".fl"), std::string::npos) << prologue.name;
    constexpr size_t kKSteps = 128 / 16;
    const auto [qk_loop, pv_loop] = qk_pv_wgmmas(in_loop.ptx);
    const auto [qk_prologue, pv_prologue] = qk_pv_wgmmas(prologue.ptx);
    // The QK is issued in two places either way: the first step's issue has a branch of its own,
    // without which ptxas serializes the pingpong kernels' wgmmas.
    EXPECT_EQ(qk_loop, 2 * kKSteps) << in_loop.name;
    EXPECT_EQ(qk_prologue, 2 * kKSteps) << prologue.name;
    EXPECT_EQ(pv_loop, pv_prologue) << in_loop.name;
    EXPECT_LT(2 * count_of(in_loop.ptx, "ex2.approx"), count_of(prologue.ptx, "ex2.approx") + 16) << in_loop.name;
    for (const CompiledKernel *kernel : {&in_loop, &prologue}) {
      EXPECT_EQ(kernel->resources.spill_store_bytes, 0) << kernel->name;
      for (const std::string &warning : kernel->resources.warnings)
        ADD_FAILURE() << kernel->name << ": ptxas warning: " << warning;
      std::string error;
      const std::string sass = testing::dump_sass(kernel->cubin, &error);
      ASSERT_TRUE(error.empty()) << error;
      EXPECT_FALSE(wgmmas_serialized(sass)) << kernel->name << ": a wait after every HGMMA";
    }
  }
}

// A programmatic launch (programmatic_launch=1, `.pdl`): every thread waits for the previous grid
// once, after the prologue, and one thread lets the next grid launch; an ordinary kernel has
// neither instruction. Both compile without spills or warnings.
TEST(Fa3CompileFeatures, ProgrammaticLaunchWaitsOnceAfterThePrologue) {
  const KernelSpec spec = testing::prefill_spec(Arch{90, true}, 128, 128, FLASHJIT_BF16, false);
  Fa3Tuning programmatic;
  programmatic.programmatic_launch = 1;
  const CompiledKernel pdl = compile_tuned(spec, programmatic);
  const CompiledKernel ordinary = compile_tuned(spec, Fa3Tuning{});
  ASSERT_FALSE(pdl.cubin.empty());
  ASSERT_FALSE(ordinary.cubin.empty());
  EXPECT_NE(pdl.name.find(".pdl"), std::string::npos) << pdl.name;
  EXPECT_EQ(count_of(pdl.ptx, "griddepcontrol.wait"), 1u) << pdl.name;
  EXPECT_EQ(count_of(pdl.ptx, "griddepcontrol.launch_dependents"), 1u) << pdl.name;
  EXPECT_EQ(count_of(ordinary.ptx, "griddepcontrol"), 0u) << ordinary.name;
  // The wait comes after the prologue's barrier inits and before the first tensor load.
  const size_t wait = pdl.ptx.find("griddepcontrol.wait");
  EXPECT_LT(pdl.ptx.rfind("mbarrier.init", wait), wait) << pdl.name;
  EXPECT_GT(pdl.ptx.find("cp.async.bulk.tensor"), wait) << pdl.name;
  for (const CompiledKernel *kernel : {&pdl, &ordinary}) {
    EXPECT_EQ(kernel->resources.spill_store_bytes, 0) << kernel->name;
    EXPECT_TRUE(kernel->resources.warnings.empty()) << kernel->name;
  }
}

// The unmasked key loop (kUnmaskedKeyLoop, `.um`, the default without masking): the element mask,
// a comparison per score, is compiled for the tile's last block only, not again inside the loop.
TEST(Fa3CompileFeatures, UnmaskedKeyLoopComparesOnlyInThePrologue) {
  const KernelSpec spec = testing::prefill_spec(Arch{90, true}, 128, 128, FLASHJIT_BF16, false);
  Fa3Tuning masked_loop;
  masked_loop.unmasked_key_loop = 0;
  const CompiledKernel unmasked = compile_tuned(spec, Fa3Tuning{});
  const CompiledKernel masked = compile_tuned(spec, masked_loop);
  ASSERT_FALSE(unmasked.cubin.empty());
  ASSERT_FALSE(masked.cubin.empty());
  EXPECT_NE(unmasked.name.find(".um"), std::string::npos) << unmasked.name;
  EXPECT_EQ(masked.name.find(".um"), std::string::npos) << masked.name;
  Plan plan;
  std::string why;
  ASSERT_TRUE(plan_fa3(spec, &plan, &why)) << why;
  const size_t scores_per_thread = static_cast<size_t>(plan.block_n / 2);
  EXPECT_GE(count_of(masked.ptx, "setp."), count_of(unmasked.ptx, "setp.") + scores_per_thread)
      << "the loop's copy of the mask should be gone";
  for (const CompiledKernel *kernel : {&unmasked, &masked}) {
    EXPECT_EQ(kernel->resources.spill_store_bytes, 0) << kernel->name;
    EXPECT_TRUE(kernel->resources.warnings.empty()) << kernel->name;
  }
}

TEST(Fa3CompileFeatures, VarlenWindowSoftcapGqaCompile) {
  KernelSpec spec = testing::prefill_spec(Arch{90, true}, 112, 112, FLASHJIT_FP16, true);
  spec.varlen = spec.local = spec.softcap = true;
  CompiledKernel kernel = testing::compile_or_fail(spec, Variant::fa3);
  EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name;
}

struct PagedCase {
  int dqk, dv;
  flashjit_dtype dtype;
  bool causal, varlen, local;
  int page_size;
};

// The kernel of a paged case under `tuning` (its spec in *spec), checked as every paged kernel must
// be: named by its page size, no spills, no ptxas warning.
CompiledKernel compile_paged(const PagedCase &c, const Fa3Tuning &tuning, KernelSpec *spec) {
  *spec = testing::prefill_spec(Arch{90, true}, c.dqk, c.dv, c.dtype, c.causal);
  spec->varlen = c.varlen;
  spec->local = c.local;
  spec->page_size = c.page_size;
  CompiledKernel kernel = compile_tuned(*spec, tuning);
  EXPECT_FALSE(kernel.cubin.empty());
  EXPECT_NE(kernel.name.find(".page" + std::to_string(c.page_size) + "."), std::string::npos) << kernel.name;
  EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name << "\n" << kernel.log;
  for (const std::string &warning : kernel.resources.warnings)
    ADD_FAILURE() << kernel.name << ": ptxas warning: " << warning;
  return kernel;
}

// A paged kernel's consumers are those of the unpaged kernel with varying lengths (varlen) of the
// same tile (pages of whole 64-key boxes take key blocks of their own): the same number of HGMMAs.
void expect_the_unpaged_varlen_consumers(const CompiledKernel &kernel, const KernelSpec &spec,
                                         const std::string &sass) {
  Plan paged_plan;
  std::string why;
  ASSERT_TRUE(plan_fa3(spec, &paged_plan, &why)) << why;
  KernelSpec unpaged = spec;
  unpaged.page_size = 0;
  unpaged.varlen = true;
  Fa3Tuning same_tile;
  same_tile.block_n = paged_plan.block_n;
  same_tile.consumer_warpgroups = paged_plan.consumer_warpgroups;
  const CompiledKernel reference = compile_tuned(unpaged, same_tile);
  std::string reference_error;
  EXPECT_EQ(count_of(sass, "HGMMA"), count_of(testing::dump_sass(reference.cubin, &reference_error), "HGMMA"))
      << kernel.name << " against " << reference.name;
}

// Paged KV (kPageSize > 0, tuning paged=1): the producer warp reads the block table and loads each
// K/V block as page boxes by TMA, and zeroes V's rows past a sequence's end (st.shared, then the
// proxy fence) before it completes the consumers' barrier; single CTAs (no multicast). The consumers
// are those of the unpaged kernel with varying lengths (varlen): the same number of HGMMAs.
TEST(Fa3CompileFeatures, PagedKvLoadsPageBoxesAndZeroesTheVTail) {
  Fa3Tuning paged;
  paged.paged = 1;
  for (const PagedCase &c : {PagedCase{128, 128, FLASHJIT_BF16, false, false, false, 16},
                             PagedCase{80, 80, FLASHJIT_FP16, true, true, false, 64},
                             PagedCase{256, 256, FLASHJIT_BF16, false, false, true, 24},
                             PagedCase{192, 128, FLASHJIT_BF16, true, false, false, 32},
                             PagedCase{64, 64, FLASHJIT_FP16, false, true, false, 512}}) {
    KernelSpec spec;
    const CompiledKernel kernel = compile_paged(c, paged, &spec);
    for (const char *instruction : {"cp.async.bulk.tensor", "ld.global.nc", "st.shared.v4.b32",
                                    "fence.proxy.async.shared::cta", "wgmma.mma_async", "setmaxnreg"})
      EXPECT_NE(kernel.ptx.find(instruction), std::string::npos) << kernel.name << " lacks " << instruction;
    EXPECT_EQ(kernel.ptx.find("multicast::cluster"), std::string::npos) << kernel.name;
    std::string error;
    const std::string sass = testing::dump_sass(kernel.cubin, &error);
    ASSERT_TRUE(error.empty()) << error;
    EXPECT_NE(sass.find("UTMALDG"), std::string::npos) << kernel.name;
    EXPECT_EQ(sass.find("LDL"), std::string::npos) << kernel.name << " reads local memory";
    EXPECT_FALSE(wgmmas_serialized(sass)) << kernel.name << ": a wait after every HGMMA";
    EXPECT_EQ(r2ur_descriptors_inside_gemm_groups(sass), 0) << kernel.name;
    expect_the_unpaged_varlen_consumers(kernel, spec, sass);
  }
}

// Instructions of the shortest loop (a backward branch and what lies between its target and it)
// that holds `opcode`, not counting `@!PT LDS` (never-executed placeholders ptxas puts before an
// LDGSTS); 0 if no loop holds it.
int shortest_loop_with(const std::string &sass, const std::string &opcode) {
  const std::regex instruction(R"(/\*([0-9a-f]{4,})\*/\s+([^;]*);)");
  const std::regex branch(R"(BRA (?:\S+ )?0x([0-9a-f]+))");
  std::vector<std::pair<unsigned long, std::string>> program;
  std::istringstream lines(sass);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, instruction))
      program.emplace_back(std::stoul(m[1].str(), nullptr, 16), m[2].str());
  }
  int shortest = 0;
  for (size_t end = 0; end < program.size(); ++end) {
    std::smatch b;
    if (!std::regex_search(program[end].second, b, branch))
      continue;
    const unsigned long target = std::stoul(b[1].str(), nullptr, 16);
    if (target >= program[end].first)
      continue;
    int count = 0;
    bool holds = false;
    for (size_t i = end + 1; i-- > 0 && program[i].first >= target;) {
      holds = holds || program[i].second.find(opcode) != std::string::npos;
      count += program[i].second.rfind("@!PT LDS", 0) == 0 ? 0 : 1;
    }
    if (holds && (shortest == 0 || count < shortest))
      shortest = count;
  }
  return shortest;
}

// Paged KV gathered (pages boxes cannot tile, or paged_gather=1), in its fenced form (gather_noinc=0,
// the default until session 32): the producer warpgroup copies the rows by cp.async (zero-filled past
// a sequence's end), prefetches the block's page numbers, and publishes a block after the next is
// issued (wait_group 1, the proxy fence, an arrival), or before a wait that would block (test_wait,
// then wait_group 0). Q
// still comes by TMA and O leaves by TMA; no K/V TMA, no V zeroing by st.shared. The consumers are
// those of the unpaged varlen kernel (the same HGMMA count); the producer fits its registers.
//
// A gather pass (one row's copies a thread) costs instructions in the producer's issue slots, which
// it shares with the consumers: session 30 measured 15-24 a pass (one to four panels; 32-bit strides,
// unsigned page divisions, the swizzle kept from pass to pass) where 64-bit addressing took 24-38.
// `max_pass` is session 30's count plus one.
TEST(Fa3CompileFeatures, GatheredPagesCopyRowsByCpAsync) {
  struct GatherCase {
    PagedCase paged;
    bool force;
    int max_pass;
  };
  const GatherCase cases[] = {{{128, 128, FLASHJIT_BF16, false, false, false, 1}, false, 16},
                              {{72, 72, FLASHJIT_FP16, true, true, false, 3}, false, 24},
                              {{256, 256, FLASHJIT_BF16, false, false, true, 12}, false, 25},
                              {{192, 128, FLASHJIT_BF16, true, false, false, 1}, false, 17},
                              {{64, 64, FLASHJIT_FP16, false, true, false, 16}, true, 20}};
  for (const auto &[c, force, max_pass] : cases) {
    Fa3Tuning paged;
    paged.paged = 1;
    paged.paged_gather = force ? 1 : -1;
    paged.gather_noinc = 0;
    KernelSpec spec;
    const CompiledKernel kernel = compile_paged(c, paged, &spec);
    EXPECT_NE(kernel.name.find(".gather."), std::string::npos) << kernel.name;
    for (const char *instruction :
         {"cp.async.cg.shared.global", "cp.async.wait_group 1", "cp.async.wait_group 0", "mbarrier.test_wait",
          "prefetch.global.L1", "ld.global.nc", "fence.proxy.async.shared::cta", "cp.async.bulk.tensor",
          "wgmma.mma_async", "setmaxnreg"})
      EXPECT_NE(kernel.ptx.find(instruction), std::string::npos) << kernel.name << " lacks " << instruction;
    EXPECT_EQ(kernel.ptx.find("st.shared.v4.b32"), std::string::npos) << kernel.name << ": zeroing V by st.shared";
    EXPECT_EQ(kernel.ptx.find("multicast::cluster"), std::string::npos) << kernel.name;
    std::string error;
    const std::string sass = testing::dump_sass(kernel.cubin, &error);
    ASSERT_TRUE(error.empty()) << error;
    EXPECT_NE(sass.find("LDGSTS"), std::string::npos) << kernel.name;
    const int pass = shortest_loop_with(sass, "LDGSTS");
    EXPECT_GT(pass, 0) << kernel.name << ": no loop of copies";
    EXPECT_LE(pass, max_pass) << kernel.name << ": instructions a gather pass";
    // Q's TMA load and O's TMA store only: one UTMALDG per Q box.
    EXPECT_NE(sass.find("UTMALDG"), std::string::npos) << kernel.name;
    EXPECT_EQ(sass.find("LDL"), std::string::npos) << kernel.name << " reads local memory";
    EXPECT_FALSE(wgmmas_serialized(sass)) << kernel.name << ": a wait after every HGMMA";
    expect_the_unpaged_varlen_consumers(kernel, spec, sass);
  }
}

// The tuning `stages` (an A/B): with a ring of S slots the fenced gather publishes a K or V block once
// 2(S - 1) - 1 newer ones are issued (cp.async.wait_group 3 at three stages, 5 at four), the default
// gather's copies arrive as they land at any depth, and TMA kernels take the deeper ring too; all
// without spills or serialized wgmmas.
TEST(Fa3CompileFeatures, DeeperRingsKeepMoreGatheredCopiesInFlight) {
  const std::pair<PagedCase, int> gathered[] = {{{64, 64, FLASHJIT_BF16, true, false, false, 1}, 3},
                                                {{64, 64, FLASHJIT_BF16, true, true, false, 1}, 4},
                                                {{128, 128, FLASHJIT_FP16, false, false, false, 3}, 3}};
  for (const auto &[c, stages] : gathered) {
    for (const int noinc : {0, 1}) {
      Fa3Tuning tuning;
      tuning.stages = stages;
      tuning.gather_noinc = noinc;
      KernelSpec spec;
      const CompiledKernel kernel = compile_paged(c, tuning, &spec);
      EXPECT_NE(kernel.name.find(noinc ? ".gather.noinc." : ".gather.al"), std::string::npos) << kernel.name;
      EXPECT_NE(kernel.name.find("s" + std::to_string(stages) + "."), std::string::npos) << kernel.name;
      const std::string in_flight = "cp.async.wait_group " + std::to_string(2 * (stages - 1) - 1) + ";";
      EXPECT_EQ(kernel.ptx.find(in_flight) != std::string::npos, noinc == 0) << kernel.name << ": " << in_flight;
      EXPECT_EQ(kernel.ptx.find("cp.async.wait_group 1;"), std::string::npos) << kernel.name;
      std::string error;
      const std::string sass = testing::dump_sass(kernel.cubin, &error);
      ASSERT_TRUE(error.empty()) << error;
      EXPECT_EQ(sass.find("LDL"), std::string::npos) << kernel.name << " reads local memory";
      EXPECT_FALSE(wgmmas_serialized(sass)) << kernel.name << ": a wait after every HGMMA";
    }
  }
  Fa3Tuning three;
  three.stages = 3;
  const KernelSpec spec = testing::prefill_spec(Arch{90, true}, 128, 128, FLASHJIT_BF16, true);
  const CompiledKernel kernel = compile_tuned(spec, three);
  EXPECT_NE(kernel.name.find("s3."), std::string::npos) << kernel.name;
  EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name << "\n" << kernel.log;
  std::string error;
  const std::string sass = testing::dump_sass(kernel.cubin, &error);
  ASSERT_TRUE(error.empty()) << error;
  EXPECT_FALSE(wgmmas_serialized(sass)) << kernel.name << ": a wait after every HGMMA";
}

// The gather by default (gather_noinc, since session 32): each thread's copies of a block arrive on its
// full barrier as they land (cp.async.mbarrier.arrive.noinc), FA-3's counting: no copy group is waited
// for but at the walk's end, no proxy fence publishes a block (one MEMBAR is left: the epilogue's), and
// the pass stays as short as the fenced form's. (paged=1 keeps fa3 where fa2 is preferred: d64.)
TEST(Fa3CompileFeatures, GatheredCopiesArriveAsTheyLand) {
  const std::pair<PagedCase, int> cases[] = {{{128, 128, FLASHJIT_BF16, true, false, false, 1}, 16},
                                             {{64, 64, FLASHJIT_FP16, false, true, false, 3}, 21},
                                             {{72, 72, FLASHJIT_BF16, true, true, false, 7}, 26}};
  for (const auto &[c, max_pass] : cases) {
    Fa3Tuning tuning;
    tuning.paged = 1;
    KernelSpec spec;
    const CompiledKernel kernel = compile_paged(c, tuning, &spec);
    EXPECT_NE(kernel.name.find(".gather.noinc."), std::string::npos) << kernel.name;
    EXPECT_NE(kernel.ptx.find("cp.async.mbarrier.arrive.noinc.shared::cta.b64"), std::string::npos) << kernel.name;
    EXPECT_NE(kernel.ptx.find("cp.async.wait_all"), std::string::npos) << kernel.name;
    for (const char *instruction : {"cp.async.cg.shared.global", "prefetch.global.L1", "ld.global.nc",
                                    "cp.async.bulk.tensor", "wgmma.mma_async", "setmaxnreg"})
      EXPECT_NE(kernel.ptx.find(instruction), std::string::npos) << kernel.name << " lacks " << instruction;
    EXPECT_EQ(kernel.ptx.find("cp.async.wait_group"), std::string::npos) << kernel.name;
    EXPECT_EQ(kernel.ptx.find("mbarrier.test_wait"), std::string::npos)
        << kernel.name << ": no publication before a wait";
    std::string error;
    const std::string sass = testing::dump_sass(kernel.cubin, &error);
    ASSERT_TRUE(error.empty()) << error;
    EXPECT_EQ(testing::count_of(sass, "MEMBAR"), size_t{1}) << kernel.name;
    const int pass = shortest_loop_with(sass, "LDGSTS");
    EXPECT_GT(pass, 0) << kernel.name << ": no loop of copies";
    EXPECT_LE(pass, max_pass) << kernel.name << ": instructions a gather pass";
    EXPECT_EQ(sass.find("LDL"), std::string::npos) << kernel.name << " reads local memory";
    EXPECT_FALSE(wgmmas_serialized(sass)) << kernel.name << ": a wait after every HGMMA";
    expect_the_unpaged_varlen_consumers(kernel, spec, sass);
  }
}

} // namespace
} // namespace flashjit
