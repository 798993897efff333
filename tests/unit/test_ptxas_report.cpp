// ptxas -v reports with several entries: registers of the named entry, spills of any.
#include "compiler/compiled_kernel.hpp"

#include <gtest/gtest.h>

namespace flashjit {
namespace {

const char *kTwoEntries = R"(ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'fj_decode_splitk' for 'sm_90a'
ptxas info    : Function properties for fj_decode_splitk
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 203 registers, used 1 barriers, 1024 bytes smem
ptxas info    : Compiling entry function 'fj_combine' for 'sm_90a'
ptxas info    : Function properties for fj_combine
ptxas         .     8 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads
ptxas warning : Registers are spilled to local memory in function 'fj_combine', 12 bytes spill stores
ptxas info    : Used 64 registers, used 0 barriers
)";

TEST(PtxasReport, RegistersOfTheEntrySpillsOfAny) {
  ResourceUsage decode = parse_ptxas_report(kTwoEntries, "fj_decode_splitk");
  EXPECT_EQ(decode.registers, 203);
  EXPECT_EQ(decode.static_smem_bytes, 1024);
  EXPECT_EQ(decode.spill_store_bytes, 12) << "a spill in another entry of the module must show";
  EXPECT_EQ(decode.stack_frame_bytes, 8);
  EXPECT_EQ(decode.warnings.size(), 1u);
  ResourceUsage combine = parse_ptxas_report(kTwoEntries, "fj_combine");
  EXPECT_EQ(combine.registers, 64);
  ResourceUsage any = parse_ptxas_report(kTwoEntries);
  EXPECT_EQ(any.registers, 203);
}

TEST(PtxasReport, InjectedWarpgroupArriveIsAWarning) {
  const char *log = R"(ptxas info    : Compiling entry function 'fj_fa3_prefill' for 'sm_90a'
ptxas info    : (C7519) warpgroup.arrive is injected in around line 610 by compiler to allow use of registers in GMMA in function 'fj_fa3_prefill'
ptxas info    : Used 168 registers, used 16 barriers
)";
  ResourceUsage usage = parse_ptxas_report(log, "fj_fa3_prefill");
  ASSERT_EQ(usage.warnings.size(), 1u);
  EXPECT_NE(usage.warnings[0].find("C7519"), std::string::npos);
  EXPECT_TRUE(parse_ptxas_report(kTwoEntries, "fj_combine").warnings.size() == 1u) << "infos stay infos";
}

TEST(PtxasReport, EmptyLogLeavesUnknowns) {
  ResourceUsage none = parse_ptxas_report("", "k");
  EXPECT_EQ(none.registers, -1);
  EXPECT_EQ(none.spill_store_bytes, -1);
}

} // namespace
} // namespace flashjit
